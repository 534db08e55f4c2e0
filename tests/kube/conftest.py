"""Fixtures for tests against a real API server (etcd + kube-apiserver + kwok, see
tessera.testing.cluster). The first run builds the binaries (minutes); later runs reuse them."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace

from tessera.testing.cluster import TestCluster
from tessera.testing.gpu_nodes import NodeShape
from tests.kube.scheduler_env import env, project  # noqa: F401 (tessera-scheduler: one per module)

DEFAULT_GPU_NODES = 2


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[TestCluster]:
    """One cluster for the whole session, with DEFAULT_GPU_NODES nodes of 8 x H100-80GB
    (``kube_cluster.gpu_nodes``). Tests that need other nodes create them with their own prefix."""
    cluster = TestCluster()
    cluster.start()
    try:
        cluster.gpu_nodes = cluster.create_gpu_nodes(  # type: ignore[attr-defined]
            DEFAULT_GPU_NODES, NodeShape(gpus=8, model="H100-80GB")
        )
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kube_client(kube_cluster: TestCluster) -> Client:
    """lightkube client with cluster-admin rights."""
    client: Client = kube_cluster.client()
    return client


_ns_counter = itertools.count()


@pytest.fixture
def kube_namespace(kube_client: Client, request: pytest.FixtureRequest) -> str:
    """A fresh namespace per test. Not deleted: without kube-controller-manager a deleted namespace
    stays Terminating; the whole cluster goes away at the end of the session."""
    base = request.node.name.lower().replace("_", "-")[:40].strip("-")
    name = f"{base}-{next(_ns_counter)}"
    kube_client.create(Namespace(metadata=ObjectMeta(name=name, labels={"tessera-test": name})))
    return name

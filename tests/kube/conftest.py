"""Fixtures for tests against a real API server (etcd + kube-apiserver + kwok, see
tessera.testing.cluster). The first run builds the binaries (minutes); later runs reuse them."""

from __future__ import annotations

import contextlib
import itertools
import subprocess
import sys
from collections.abc import Iterator

import pytest
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace

from tessera.testing import webhook as local
from tessera.testing.cluster import TestCluster
from tessera.testing.gpu_nodes import NodeShape
from tests.kube.admission_helpers import (
    SYSTEM_NS,
)
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


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, kube_cluster: TestCluster, kube_client: Client
          ) -> Iterator[TestCluster]:
    """The webhook and the scheduler; a module may set ``WEBHOOK_ARGS`` (more webhook flags)."""
    docs = local.helm_template(include_crds=True)
    local.apply(kube_cluster, [d for d in docs if d["kind"] == "CustomResourceDefinition"])
    kube_cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                         "crd/projects.tessera.io", "crd/podgroups.tessera.io")
    sched_kc = kube_cluster.service_account_kubeconfig(SYSTEM_NS, "tessera-scheduler")
    hook_kc = kube_cluster.service_account_kubeconfig(SYSTEM_NS, "tessera-webhook")
    local.apply(kube_cluster, [d for d in docs if d["kind"] in (
        "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")])
    assert kube_cluster.workdir is not None
    logs = kube_cluster.workdir / "logs"
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(name: str, args: list[str]) -> None:
        with (logs / f"{name}.log").open("ab") as log:
            procs.append(subprocess.Popen([sys.executable, *args], stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))

    hook = local.start_webhook(kube_cluster, name="e2e-webhook", kubeconfig=hook_kc,
                               extra_args=list(getattr(request.module, "WEBHOOK_ARGS", ())))
    spawn("e2e-scheduler", ["-m", "tessera.kube.scheduler", f"--kubeconfig={sched_kc}",
                            "--lease-name=tessera-scheduler-admission-e2e",
                            "--lease-duration=3", "--identity=e2e"])
    try:
        local.register(kube_cluster, hook)
        yield kube_cluster
    finally:
        local.unregister(kube_cluster)
        hook.stop()
        for p in procs:
            p.terminate()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
            if p.poll() is None:
                p.kill()

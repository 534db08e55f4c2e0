"""One workload stack (tessera.testing.workload_stack: API server, kube-controller-manager, two
kwok nodes of 4 GPUs, tessera's webhook and scheduler) for every module here that asks for the
default one (``stack``): test_sweep_kube, test_workload_engines and test_workloads_kube each
started an identical stack of their own, 10-20 s apiece on 2 cores (docs/testing.md).
test_gang_binding keeps its own (other scheduler flags, no controller manager).

Tests that share it give back what they take: after each test the namespaces it made are
deleted and the test waits until their pods are gone, so the next test (of any of these
modules, in any order) finds the 8 GPUs free (the last CI failure, commit cd0f209, was a gang
waiting behind an earlier test's pods). The stack stops after the last test of this directory,
not at the end of the session."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Namespace, Pod

from tessera.testing.cluster import TestCluster
from tessera.testing.workload_stack import workload_stack
from tests.waiting import wait_until

HERE = Path(__file__).resolve().parent
_stack = contextlib.ExitStack()
_cluster: list[TestCluster] = []


def _shared() -> TestCluster:
    """Started on first use; stopped by pytest_runtest_teardown below after this directory's
    last test (or at the session's end, whichever comes first)."""
    if not _cluster:
        _cluster.append(_stack.enter_context(workload_stack()))
    return _cluster[0]


@pytest.fixture(scope="module")
def stack() -> TestCluster:
    return _shared()


@pytest.fixture(scope="module")
def client(stack: TestCluster) -> Client:
    c: Client = stack.client()
    return c


@pytest.fixture(autouse=True)
def each_test_gives_its_gpus_back(request: pytest.FixtureRequest) -> Iterator[None]:
    """Only for tests on the shared stack: delete the namespaces the test made and wait until
    their pods are gone (the namespace controller of kube-controller-manager removes them)."""
    if "stack" not in request.fixturenames or request.getfixturevalue("stack") not in _cluster:
        yield
        return
    client: Client = request.getfixturevalue("client")
    before = {n.metadata.name for n in client.list(Namespace)}
    yield
    made = [n.metadata.name for n in client.list(Namespace) if n.metadata.name not in before]
    for ns in made:
        client.delete(Namespace, ns)
    # A Terminating namespace takes no new objects, so no controller can make its pods again;
    # deleting them at once (grace 0, as kwok runs no containers) frees their GPUs without
    # waiting for the namespace controller's sweep (about 5 s a test under load).
    for ns in made:
        client.deletecollection(Pod, namespace=ns, grace_period=0)
    wait_until("the test's pods to be deleted", lambda: not any(
        list(client.list(Pod, namespace=ns)) for ns in made), timeout=60)


def _stop() -> None:
    _cluster.clear()
    _stack.close()


@pytest.hookimpl(trylast=True)  # after the runner has torn down the module's fixtures
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if _cluster and (nextitem is None or HERE not in Path(str(nextitem.path)).parents):
        _stop()


def pytest_sessionfinish() -> None:
    _stop()

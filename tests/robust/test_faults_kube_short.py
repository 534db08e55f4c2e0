"""The short form of the Kubernetes fault suite (``python -m tessera.bench.faults_kube``) in the
test suite, on a cluster of its own (the webhook trial registers a webhook, which must not
refuse the shared cluster's pods): one kill -9 trial of tessera-scheduler, of kube-apiserver
and of a node's tessera-node, and one of tessera-webhook, each followed by the suite's
invariant checks. The full runs are in docs/benchmarks.md (fault suite)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from tessera.bench import faults_kube
from tessera.testing.cluster import TestCluster


@pytest.fixture(scope="module")
def fault_env() -> Iterator[tuple[Any, str]]:
    cluster = TestCluster()
    cluster.start()
    env = None
    try:
        env, ns = faults_kube.setup(cluster)
        yield env, ns
    finally:
        if env is not None:
            env.stop()
        cluster.stop()


@pytest.mark.parametrize("fault", faults_kube.FAULTS)
def test_kill_trial_keeps_the_invariants(fault_env: tuple[Any, str], fault: str) -> None:
    env, ns = fault_env
    summary = faults_kube.run_fault(env, ns, fault, 1, 6, random.Random(7))
    assert summary["failed_trials"] == 0, summary


def test_webhook_kill_trial_admits_nothing_unchecked(fault_env: tuple[Any, str]) -> None:
    env, _ = fault_env
    summary = faults_kube.webhook_trials(env.cluster, env.client, 1, random.Random(7))
    assert summary["admitted_unchecked"] == 0, summary
    assert summary["admitted"] + summary["refused"] > 0


def test_check_sees_an_over_committed_gpu(fault_env: tuple[Any, str]) -> None:
    """The invariant check itself can fail: two pods bound by hand onto one GPU, 30 GiB each
    on a 40 GiB device, are reported."""
    import json

    from lightkube import codecs
    from lightkube.resources.core_v1 import Pod

    from tessera.kube import names

    env, ns = fault_env
    node = sorted(env.agents)[0]
    uuid = env.agents[node].uuids[0]
    placement = {"node": node, "devices": [0], "request": [30 * 2**30], "limit": [30 * 2**30],
                 "exclusive": False, "cpu": 0, "memory": 0}
    for name in ("over-a", "over-b"):
        env.client.create(codecs.from_dict({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "annotations": {
                names.PLACEMENT: json.dumps(placement), names.NODE_GPU_UUIDS: uuid}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "x"}]}}))
    try:
        problems = faults_kube.check(env.client, ns)
        assert any("over-committed" in p for p in problems), problems
    finally:
        for name in ("over-a", "over-b"):
            env.client.delete(Pod, name, namespace=ns, grace_period=0)


def test_scheduler_started_while_the_api_server_is_down_waits_for_it(
        fault_env: tuple[Any, str]) -> None:
    """A scheduler (re)started during a control-plane outage waits for the API server instead
    of exiting (which a Deployment turns into a crash loop with a growing back-off), then
    schedules. It used to exit at its first request."""
    import time

    from lightkube import codecs

    env, ns = fault_env
    env.stop()
    restarts = env.restarts
    env.cluster.restart_apiserver(kill=True, down_seconds=4.0, while_down=env.start_scheduler)
    time.sleep(1.0)
    try:
        assert env.proc is not None and env.proc.poll() is None, "the scheduler exited"
        env.client.create(codecs.from_dict(faults_kube._share_pod(
            "after-outage", ns, "0.25", "ab" * 8)))
        bound = faults_kube._wait(lambda: any(
            p.metadata.name == "after-outage" and p.spec.nodeName
            for p in faults_kube._pods(env.client, ns)), 60)
        assert bound, "not bound after the outage"
        assert env.restarts == restarts and env.proc.poll() is None
    finally:
        from lightkube.resources.core_v1 import Pod

        env.client.delete(Pod, "after-outage", namespace=ns, grace_period=0)
        env.stop()

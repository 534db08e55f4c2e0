"""tessera's predicates against kube-scheduler v1.36.3 on generated cases (the short run; the
full 500-case check is ``python -m tessera.bench.kube_differential``). See
tessera.testing.kube_differential for what a case is and what must agree."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tessera.testing import kube_differential as kd
from tessera.testing.cluster import TestCluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[TestCluster]:
    """A private cluster: kube-scheduler must see only the generated nodes."""
    c = TestCluster()
    c.start()
    proc = kd.start_kube_scheduler(c)
    try:
        yield c
    finally:
        proc.terminate()
        proc.wait(10)
        c.stop()


def test_tessera_agrees_with_kube_scheduler(cluster: TestCluster) -> None:
    result = kd.run(cluster, worlds=12, cases_per_world=10, seed=20261124)
    assert result.cases == 120
    # both outcomes occur, so both directions of the check are exercised
    assert result.bound > 20 and result.unschedulable > 20
    assert not result.disagreements, "\n".join(
        f"kube-scheduler: {d.kube or 'unschedulable'} ({d.message}); tessera: {d.tessera}; "
        f"pod: {json.dumps(d.pod['spec'])}" for d in result.disagreements[:5])


def test_a_predicate_left_out_is_caught(cluster: TestCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: without TaintToleration tessera disagrees with kube-scheduler."""
    from tessera.kube.predicates import constraint

    monkeypatch.setattr(constraint, "taint_toleration_filter", lambda pod, node: None)
    result = kd.run(cluster, worlds=4, cases_per_world=10, seed=7)
    assert result.disagreements

"""``plainly_valid`` (the fast path of a snapshot's validation) passes only workloads the full
``validate_workload`` passes, and ``validate_workloads`` refuses exactly what the one-by-one
validation refused, with the same field and words."""

from __future__ import annotations

import dataclasses
import random

from tessera.core.cycle.validation import (
    leaf_projects,
    plainly_valid,
    validate_workload,
    validate_workloads,
)
from tessera.core.errors import InvalidRequest
from tessera.core.projects import Project, ProjectTree
from tessera.core.state import Placement

from .scenario import request

TREE = ProjectTree([Project("dept"), Project("a", parent="dept"), Project("b", parent="dept"), Project("solo")])
REQ = request(1)


def _placement() -> Placement:
    return Placement("n0", (0,), (1,), (1,), exclusive=True)


def _base(rng: random.Random, i: int) -> object:
    from tessera.core.workloads import Workload

    pods = (REQ,) * rng.randint(1, 3)
    running = rng.random() < 0.5
    return Workload(f"w{i}", rng.choice(["a", "b", "solo"]), pods,
                    priority_class=rng.choice(["train", "build", "inference"]),
                    started_at=1.0 if running else None,
                    placements=tuple(_placement() for _ in pods) if running else ())


MUTATIONS = [
    lambda w, r: dataclasses.replace(w, id=""),
    lambda w, r: dataclasses.replace(w, id=7),
    lambda w, r: dataclasses.replace(w, pods=()),
    lambda w, r: dataclasses.replace(w, priority_class="gold"),
    lambda w, r: dataclasses.replace(w, priority_class=["train"]),
    lambda w, r: dataclasses.replace(w, min_members=r.choice([0, 1, 9, True, 1.5])),
    lambda w, r: dataclasses.replace(w, placements=(None,) * (len(w.pods) + 1)),
    lambda w, r: dataclasses.replace(w, placements=(None,) * len(w.pods)),
    lambda w, r: dataclasses.replace(w, placements=(_placement(),) * len(w.pods), started_at=None),
    lambda w, r: dataclasses.replace(w, placements=list(w.placements)),
    lambda w, r: dataclasses.replace(w, constraints=(None,) * r.choice([len(w.pods), len(w.pods) + 1])),
    lambda w, r: dataclasses.replace(w, pod_names=("x",) * r.choice([len(w.pods), 5])),
    lambda w, r: dataclasses.replace(w, anchors=r.choice([(0,), (0, 0), (9,), (True,)])),
    lambda w, r: dataclasses.replace(w, project=r.choice(["dept", "nope", "a", ["a"]])),
]


def _outcome(check: object) -> str | None:
    try:
        check()  # type: ignore[operator]
    except (InvalidRequest, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def test_fast_path_passes_only_what_the_full_validation_passes() -> None:
    rng = random.Random(33)
    leaves = leaf_projects(TREE)
    assert leaves == {"a", "b", "solo"}
    fast = 0
    for i in range(3000):
        w = _base(rng, i)
        for _ in range(rng.choice([0, 0, 1, 2])):
            w = rng.choice(MUTATIONS)(w, rng)
        full = _outcome(lambda w=w: validate_workload(w, TREE))  # type: ignore[misc]
        if plainly_valid(w, leaves):  # type: ignore[arg-type]
            fast += 1
            assert full is None, (w, full)
        # the whole snapshot's validation says what the one-by-one validation says
        assert _outcome(lambda w=w: validate_workloads([w], TREE)) == full  # type: ignore[misc]
    assert fast > 1000  # the fast path is taken for the usual workload


def test_first_refused_workload_of_a_snapshot_is_named() -> None:
    rng = random.Random(5)
    good = [_base(rng, i) for i in range(20)]
    bad = dataclasses.replace(good[7], min_members=0)  # type: ignore[type-var]
    ws = [*good[:7], bad, *good[8:]]
    err = _outcome(lambda: validate_workloads(ws, TREE))  # type: ignore[arg-type]
    assert err is not None and "workloads.w7.min_members" in err
    dup = _outcome(lambda: validate_workloads([*good, good[3]], TREE))  # type: ignore[arg-type]
    assert dup is not None and "workloads.w3" in dup and "given twice" in dup

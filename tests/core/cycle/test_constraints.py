"""Node constraints (``tessera.core.constraints``) are honoured by every action of the cycle."""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera.core.constraints import PlacedPods
from tessera.core.cycle import Workload
from tessera.core.model import Node

from .scenario import bound, cycle, evicted, nodes, project, waiting, workload


@dataclass(frozen=True)
class Only:
    """Allows the named nodes; prefers ``prefer`` (score 1)."""

    names: frozenset[str]
    prefer: frozenset[str] = frozenset()
    dynamic: bool = False

    def allows(self, node: Node) -> bool:
        return node.name in self.names

    def score(self, node: Node) -> float:
        return 1.0 if node.name in self.prefer else 0.0

    def admits(self, node: Node, placed: PlacedPods) -> bool:
        return True

    def refusals(self, nodes: tuple[Node, ...]) -> str:
        n = sum(1 for x in nodes if x.name not in self.names)
        return f"{n} didn't match the test's node list" if n else ""


@dataclass(frozen=True)
class ApartFrom:
    """Dynamic: never on a node where any of ``peers`` (workload id, pod) is placed now."""

    peers: tuple[tuple[str, int], ...]
    dynamic: bool = field(default=True)

    def allows(self, node: Node) -> bool:
        return True

    def score(self, node: Node) -> float:
        return 0.0

    def admits(self, node: Node, placed: PlacedPods) -> bool:
        return all(placed.node_of(w, i) != node.name for w, i in self.peers)

    def refusals(self, nodes: tuple[Node, ...]) -> str:
        return ""


def only(*names: str, prefer: tuple[str, ...] = ()) -> Only:
    return Only(frozenset(names), frozenset(prefer))


def constrained(w: Workload, *cs: object) -> Workload:
    from dataclasses import replace

    return replace(w, constraints=tuple(cs) * (len(w.pods) // len(cs)))  # type: ignore[arg-type]


def test_allocate_uses_only_allowed_nodes() -> None:
    ns = nodes(3, gpus=1)
    w = constrained(workload(ns, "w", "a", 0.5), only("n3"))
    assert bound(cycle(ns, [project("a", 1)], [w])) == {"w": ["n3:0"]}


def test_preference_decides_between_equal_nodes_and_never_allows() -> None:
    ns = nodes(3, gpus=1)
    w = constrained(workload(ns, "w", "a", 0.5), only("n1", "n2", prefer=("n2",)))
    assert bound(cycle(ns, [project("a", 1)], [w])) == {"w": ["n2:0"]}
    w = constrained(workload(ns, "w", "a", 0.5), only("n1", prefer=("n3",)))
    assert bound(cycle(ns, [project("a", 1)], [w])) == {"w": ["n1:0"]}


def test_no_allowed_node_waits_unschedulable_naming_the_constraint() -> None:
    ns = nodes(3, gpus=1)
    w = constrained(workload(ns, "w", "a", 0.5), only())
    plan = cycle(ns, [project("a", 1)], [w])
    assert bound(plan) == {}
    wait = plan.waiting_for("w")
    assert wait is not None and wait.kind == "unschedulable"
    assert wait.reason == "0/3 nodes are available: 3 didn't match the test's node list"


def test_gpu_reason_is_given_among_the_allowed_nodes() -> None:
    ns = nodes(2, gpus=1)
    running = workload(ns, "r", "a", 0.75, on=["n1:0"], cls="build")
    w = constrained(workload(ns, "w", "a", 0.5, cls="build"), only("n1"))
    plan = cycle(ns, [project("a", 2)], [running, w])
    assert bound(plan) == {}
    assert waiting(plan)["w"] == (
        "0/2 nodes are available: 1 didn't match the test's node list; on the 1 node(s) it may use: "
        "no GPU with 8 GiB free: largest free is 4 GiB on n1 GPU 0"
    )


def test_reclaim_evicts_only_on_nodes_the_reclaimer_may_use() -> None:
    ns = nodes(2, gpus=1)
    plan = cycle(
        ns,
        [project("a", 1), project("b", 0, weight=0)],
        [
            workload(ns, "b1", "b", 1, on=["n1:0"], started=1),
            workload(ns, "b2", "b", 1, on=["n2:0"], started=2),  # newer: preferred otherwise
            constrained(workload(ns, "w", "a", 1), only("n1")),
        ],
    )
    assert evicted(plan) == {"b1"} and bound(plan) == {"w": ["n1:0"]}


def test_preempt_evicts_only_on_nodes_the_preemptor_may_use() -> None:
    ns = nodes(2, gpus=1)
    plan = cycle(
        ns,
        [project("a", 2)],
        [
            workload(ns, "t1", "a", 1, on=["n1:0"], started=1),
            workload(ns, "t2", "a", 1, on=["n2:0"], started=2),
            constrained(workload(ns, "inf", "a", 1, cls="inference"), only("n1")),
        ],
        actions=("allocate", "preempt"),
    )
    assert evicted(plan) == {"t1"} and bound(plan) == {"inf": ["n1:0"]}


def test_consolidation_moves_a_pod_only_where_its_own_constraint_allows() -> None:
    ns = nodes(3, gpus=1)
    base = [
        workload(ns, "x1", "b", 0.5, on=["n1:0"]),
        workload(ns, "x2", "b", 0.5, on=["n2:0"]),
        workload(ns, "full", "b", 1, on=["n3:0"], cls="build"),
        workload(ns, "w", "a", 1),
    ]
    plan = cycle(ns, [project("a", 1), project("b", 2)], base, actions=("allocate", "consolidate"))
    assert len(plan.moves) == 1
    # x1 may only be on n1 and x2 only on n2: nothing can move, so nothing happens.
    pinned = [constrained(base[0], only("n1")), constrained(base[1], only("n2")), *base[2:]]
    plan = cycle(ns, [project("a", 1), project("b", 2)], pinned, actions=("allocate", "consolidate"))
    assert plan.moves == () and bound(plan) == {}


def test_backfill_respects_constraints() -> None:
    ns = nodes(2, gpus=1)
    plan = cycle(
        ns,
        [project("a", 0), project("b", 2)],
        [
            workload(ns, "b1", "b", 1, on=["n1:0"], cls="build"),
            constrained(workload(ns, "b2", "b", 1, cls="build"), only("n1")),  # b's share: 2
            constrained(workload(ns, "w", "a", 0.5), only("n2")),
        ],
    )
    assert bound(plan) == {"w": ["n2:0"]} and plan.bindings[0].action == "backfill"


def test_dynamic_constraint_keeps_gang_members_apart() -> None:
    ns = nodes(3, gpus=2)
    w = workload(ns, "g", "a", 0.25, pods=3)
    peers = (("g", 0), ("g", 1), ("g", 2))
    w = constrained(w, *(ApartFrom(tuple(p for p in peers if p[1] != i)) for i in range(3)))
    placed = bound(cycle(ns, [project("a", 3)], [w]))["g"]
    assert len({p.split(":")[0] for p in placed}) == 3
    # Four such pods on three nodes: the gang cannot start.
    w4 = workload(ns, "g", "a", 0.25, pods=4)
    peers4 = tuple(("g", i) for i in range(4))
    w4 = constrained(w4, *(ApartFrom(tuple(p for p in peers4 if p[1] != i)) for i in range(4)))
    assert bound(cycle(ns, [project("a", 3)], [w4])) == {}


def test_constraints_of_the_wrong_length_are_refused() -> None:
    import pytest

    from tessera.core.errors import InvalidRequest

    ns = nodes(1)
    w = workload(ns, "w", "a", 0.5, pods=2)
    from dataclasses import replace

    with pytest.raises(InvalidRequest, match=r"workloads\.w\.constraints"):
        cycle(ns, [project("a", 1)], [replace(w, constraints=(only("n1"),))])

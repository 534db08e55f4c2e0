"""Making MIG room by eviction (tessera.core.mig.make_room): the cheapest set of running MIG
workloads whose partitions, once idle, let choose() place a profile on one GPU. Examples and
properties checked against an exhaustive search over every set of candidates."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.core import mig

A100 = "A100-40GB"


def _gpu(key: str, *parts: tuple[str, int, str]) -> mig.MigGpu:
    """Partitions as (profile, start, holder); holder "" idle, "?" someone else's (busy)."""
    return mig.MigGpu(key, A100, tuple(
        mig.Partition(p, s, h != "", holder="" if h == "?" else h) for p, s, h in parts))


def test_one_victim_of_two_frees_the_slot_and_its_partition_is_reused() -> None:
    gpu = _gpu("g0", ("3g.20gb", 0, "a1"), ("3g.20gb", 4, "a2"))
    victims = {"a1": mig.Victim(50, 0.429), "a2": mig.Victim(50, 0.429)}
    room = mig.make_room([gpu], "3g.20gb", victims)
    assert room is not None and len(room.victims) == 1 and room.gpu == "g0"
    assert room.choice.reuse is not None and room.choice.reuse.start == room.choice.start


def test_lower_priority_then_less_gpu_is_preferred() -> None:
    gpu = _gpu("g0", ("3g.20gb", 0, "hi"), ("3g.20gb", 4, "lo"))
    room = mig.make_room([gpu], "3g.20gb", {"hi": mig.Victim(100, 0.429), "lo": mig.Victim(50, 0.429)})
    assert room is not None and room.victims == ("lo",)
    # Fewest victims before priority: one 3g.20gb at 90 rather than three 1g.5gb at 10.
    gpu = _gpu("g0", ("1g.5gb", 4, "s1"), ("1g.5gb", 5, "s2"), ("1g.5gb", 6, "s3"),
               ("3g.20gb", 0, "big"))
    victims = {"s1": mig.Victim(10, 0.143), "s2": mig.Victim(10, 0.143), "s3": mig.Victim(10, 0.143),
               "big": mig.Victim(90, 0.429)}
    room = mig.make_room([gpu], "3g.20gb", victims)
    assert room is not None and room.victims == ("big",)


def test_nothing_needless_nothing_foreign_and_none_when_nothing_helps() -> None:
    # 7g.40gb needs the whole GPU: a foreign (operator's) partition blocks it for good.
    gpu = _gpu("g0", ("3g.20gb", 0, "a1"), ("3g.20gb", 4, "?"))
    assert mig.make_room([gpu], "7g.40gb", {"a1": mig.Victim(50, 0.429)}) is None
    # A profile the model lacks is never made room for.
    assert mig.make_room([gpu], "3g.40gb", {"a1": mig.Victim(50, 0.429)}) is None
    # The rule refuses every set: nobody is evicted.
    assert mig.make_room([_gpu("g0", ("7g.40gb", 0, "a1"))], "1g.5gb",
                         {"a1": mig.Victim(50, 1.0)}, lambda gpu, vs: False) is None
    # Room already: no victim.
    room = mig.make_room([_gpu("g0", ("3g.20gb", 0, "a1"))], "3g.20gb", {"a1": mig.Victim(50, 0.429)})
    assert room is not None and room.victims == ()


def test_the_rule_sees_the_gpu_and_the_set() -> None:
    g0 = _gpu("g0", ("7g.40gb", 0, "a"))
    g1 = _gpu("g1", ("4g.20gb", 0, "b"), ("3g.20gb", 4, "c"))
    victims = {v: mig.Victim(50, 0.5) for v in "abc"}
    asked: list[tuple[str, tuple[str, ...]]] = []

    def allow(gpu: str, vs: tuple[str, ...]) -> bool:
        asked.append((gpu, vs))
        return gpu == "g1"
    room = mig.make_room([g0, g1], "2g.10gb", victims, allow)
    assert room is not None and room.gpu == "g1" and len(room.victims) == 1
    assert asked[0][0] == "g0"  # cheaper by id, refused by the rule


# -- properties ------------------------------------------------------------------------------------

_NAMES = sorted(mig.PROFILES[A100], key=lambda n: (mig.PROFILES[A100][n].compute, n))


@st.composite
def _fleets(draw: st.DrawFn) -> tuple[list[mig.MigGpu], dict[str, mig.Victim], str, frozenset[str]]:
    gpus = []
    holders: dict[str, int] = {}
    for g in range(draw(st.integers(1, 3))):
        gpu = mig.MigGpu(f"n/{g}", A100)
        for _ in range(draw(st.integers(0, 7))):
            name = draw(st.sampled_from(_NAMES))
            start = [s for s in mig.free_placements(A100, gpu.partitions, mig.PROFILES[A100][name])]
            if not start:
                continue
            kind = draw(st.sampled_from(["victim", "victim", "victim", "idle", "foreign"]))
            holder = ""
            if kind == "victim":
                holder = f"w{draw(st.integers(0, 9))}"  # a workload may hold two partitions
                holders.setdefault(holder, draw(st.integers(0, 3)) * 25)
            part = mig.Partition(name, draw(st.sampled_from(start)), kind != "idle", holder=holder)
            gpu = mig.MigGpu(gpu.key, A100, (*gpu.partitions, part))
        gpus.append(gpu)
    victims = {h: mig.Victim(p, round(0.143 * (1 + len(h) % 3), 3)) for h, p in holders.items()
               if draw(st.booleans()) or p < 50}
    refused = frozenset(draw(st.lists(st.sampled_from(sorted(holders) or ["-"]), max_size=2)))
    return gpus, victims, draw(st.sampled_from(_NAMES)), refused


def _cost(victims: dict[str, mig.Victim], combo: tuple[str, ...]) -> tuple[object, ...]:
    return (len(combo), tuple(sorted((victims[h].priority for h in combo), reverse=True)),
            round(sum(victims[h].gpus for h in combo), 6))


@settings(max_examples=300, deadline=None)
@given(_fleets(), st.integers(1, 3))
def test_the_result_is_valid_minimal_and_no_cheaper_set_exists(
        fleet: tuple[list[mig.MigGpu], dict[str, mig.Victim], str, frozenset[str]],
        most: int) -> None:
    gpus, victims, name, refused = fleet

    def allow(gpu: str, vs: tuple[str, ...]) -> bool:  # a rule: some workloads may not go, and
        return not refused & set(vs) and len(vs) <= most  # at most so many at once

    room = mig.make_room(gpus, name, victims, allow)
    # The oracle: every set of candidates on each GPU that makes room, is allowed and has no
    # needless victim.
    best = None
    for gpu in gpus:
        cands = sorted({p.holder for p in gpu.partitions if p.busy and p.holder in victims})
        for k in range(0, len(cands) + 1):
            for combo in itertools.combinations(cands, k):
                if mig.choose([mig.released(gpu, combo)], name) is None or not (k == 0 or allow(gpu.key, combo)):
                    continue
                if any(mig.choose([mig.released(gpu, combo[:i] + combo[i + 1:])], name) is not None
                       for i in range(k)):
                    continue
                if best is None or _cost(victims, combo) < best:
                    best = _cost(victims, combo)
    if mig.choose(gpus, name) is not None:
        assert room is not None and room.victims == ()
        return
    if best is None:
        assert room is None
        return
    assert room is not None
    gpu = next(g for g in gpus if g.key == room.gpu)
    assert set(room.victims) <= set(victims) and allow(room.gpu, room.victims)
    held = {p.holder for p in gpu.partitions if p.busy}
    assert set(room.victims) <= held  # only workloads holding a partition on that GPU
    after = mig.choose([mig.released(gpu, room.victims)], name)
    assert after == room.choice and after is not None
    assert not any(p.busy and p.holder not in room.victims and p.holder
                   for p in after.destroy)  # choose never removes a busy partition
    for i in range(len(room.victims)):  # every victim is needed
        fewer = room.victims[:i] + room.victims[i + 1:]
        assert mig.choose([mig.released(gpu, fewer)], name) is None
    assert _cost(victims, room.victims) == best

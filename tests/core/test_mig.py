"""MIG geometry and placement choice (tessera.core.mig): the profile tables, the spellings, and
properties of choose() over random create/release sequences."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.core import mig
from tessera.core.errors import InvalidRequest


@pytest.mark.parametrize("text", ["3g.20gb", "mig-3g.20gb", "MIG 3g.20gb", "nvidia.com/mig-3g.20gb",
                                  " 3G.20GB "])
def test_every_spelling_is_one_profile(text: str) -> None:
    assert mig.parse_profile(text) == "3g.20gb"


@pytest.mark.parametrize(("text", "says"), [
    ("", "must be a MIG profile"), ("3g", "COMPUTEg.MEMORYgb"), ("5g.30gb", "1g.5gb"),
    (7, "must be a MIG profile"), ("nvidia.com/gpu", "COMPUTEg.MEMORYgb"),
])
def test_bad_profiles_name_the_field_and_what_exists(text: object, says: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        mig.parse_profile(text, "spec.compute.gpuMigProfile")
    assert err.value.field == "spec.compute.gpuMigProfile" and says in str(err.value)


def test_tables_follow_the_geometry() -> None:
    for table in mig.PROFILES.values():
        assert len(table) == 6
        for p in table.values():
            assert all(s + p.slots <= mig.SLOTS for s in p.starts)
            assert 1 <= p.compute <= mig.COMPUTE
    a100 = mig.PROFILES["A100-40GB"]
    # NVIDIA's counts of instances per GPU: 7, 4, 3, 2, 1, 1
    counts = {n: _max_instances("A100-40GB", n) for n in a100}
    assert counts == {"1g.5gb": 7, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1,
                      "7g.40gb": 1}
    assert mig.PROFILES["A100-40GB"]["3g.20gb"].fraction == 0.429
    assert "7g.80gb" in mig.supported_text(["H100-80GB", "V100-16GB"])
    assert mig.supported_text(["V100-16GB"]) == "no MIG-capable GPU"


def _max_instances(model: str, name: str) -> int:
    gpu = mig.MigGpu("g", model)
    n = 0
    while (c := mig.choose([gpu], name)) is not None and c.reuse is None and not c.destroy:
        gpu = mig.MigGpu("g", model, (*gpu.partitions, mig.Partition(name, c.start, True)))
        n += 1
    return n


def test_idle_partition_of_the_profile_is_reused_before_creating() -> None:
    idle = mig.Partition("1g.5gb", 3, busy=False)
    gpus = [mig.MigGpu("a/0", "A100-40GB"), mig.MigGpu("b/0", "A100-40GB", (idle,))]
    choice = mig.choose(gpus, "1g.5gb")
    assert choice is not None and choice.reuse == idle and choice.gpu == "b/0"


def test_placement_keeps_the_largest_run_free_and_packs_cut_gpus() -> None:
    # A 1g.5gb at slot 0 of a cut GPU leaves 4..7 free for a 3g.20gb; an intact GPU stays intact.
    cut = mig.MigGpu("a/0", "A100-40GB", (mig.Partition("1g.5gb", 1, True),))
    whole = mig.MigGpu("b/0", "A100-40GB")
    choice = mig.choose([whole, cut], "1g.5gb")
    assert choice is not None and choice.gpu == "a/0" and choice.start in (0, 2, 3)
    # first fit would take slot 0 of the intact GPU; a 7g.40gb still fits there now
    assert mig.choose([mig.MigGpu("b/0", "A100-40GB")], "7g.40gb") is not None


def test_idle_partitions_go_only_when_nothing_else_fits_and_busy_ones_never() -> None:
    busy = mig.Partition("3g.20gb", 0, True)
    idle = mig.Partition("2g.10gb", 4, False)
    gpu = mig.MigGpu("a/0", "A100-40GB", (busy, idle))
    choice = mig.choose([gpu], "3g.20gb")
    assert choice is not None and choice.start == 4 and choice.destroy == (idle,)
    assert mig.choose([mig.MigGpu("a/0", "A100-40GB", (busy, mig.Partition("4g.20gb", 4, True)))],
                      "1g.5gb") is None  # hypothetical full GPU: nothing to take
    assert mig.choose([mig.MigGpu("a/0", "A100-40GB", (mig.Partition("7g.40gb", 0, True),))],
                      "1g.5gb") is None


def test_unknown_profile_for_the_model_has_no_place() -> None:
    assert mig.choose([mig.MigGpu("a/0", "A100-40GB")], "1g.10gb") is not None
    assert mig.choose([mig.MigGpu("a/0", "A100-40GB")], "3g.40gb") is None  # an 80 GB profile


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(0, 50)), max_size=60))
def test_random_sequences_keep_every_invariant(steps: list[tuple[bool, int, int]]) -> None:
    model = "A100-40GB"
    names = sorted(mig.PROFILES[model], key=lambda n: mig.PROFILES[model][n].compute)
    gpus = {f"n/{i}": [] for i in range(3)}  # type: dict[str, list[mig.Partition]]
    for create, which, pick in steps:
        if create:
            name = names[which]
            view = [mig.MigGpu(k, model, tuple(v)) for k, v in gpus.items()]
            free_anywhere = any(mig.free_placements(model, v, mig.PROFILES[model][name])
                                for v in gpus.values())
            idle_same = any(p.profile == name and not p.busy for v in gpus.values() for p in v)
            choice = mig.choose(view, name)
            if choice is None:
                assert not free_anywhere and not idle_same
                continue
            parts = gpus[choice.gpu]
            assert all(not p.busy for p in choice.destroy)
            if idle_same:
                assert choice.reuse is not None
            if free_anywhere or idle_same:
                assert not choice.destroy
            for p in choice.destroy:
                parts.remove(p)
            if choice.reuse is not None:
                parts.remove(choice.reuse)
            parts.append(mig.Partition(name, choice.start, True))
            prof = mig.PROFILES[model][name]
            assert choice.start in prof.starts
            taken = [0] * mig.SLOTS
            for p in parts:
                for s in range(p.start, p.start + mig.PROFILES[model][p.profile].slots):
                    taken[s] += 1
            assert max(taken) <= 1, parts
            assert sum(mig.PROFILES[model][p.profile].compute for p in parts) <= mig.COMPUTE
        else:
            busy = [(k, p) for k, v in gpus.items() for p in v if p.busy]
            if busy:
                k, p = busy[pick % len(busy)]
                gpus[k].remove(p)
                gpus[k].append(mig.Partition(p.profile, p.start, False))  # idle, kept (lazy)


def test_benchmark_runs_both_choosers_on_the_same_stream() -> None:
    from tessera.bench import mig as bench

    out = bench.run(nodes=5, mig_gpus=4, events=1500, seed=3)
    ours, ff = out["tessera"], out["first_fit"]
    assert isinstance(ours, dict) and isinstance(ff, dict)
    assert ours["placed"] + ours["refused"] == ff["placed"] + ff["refused"] > 0
    assert 0.0 <= ours["unusable_free_slots"] <= 1.0

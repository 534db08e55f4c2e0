"""The scheduler's dynamic-MIG parts without a cluster (tessera.kube.mig): the node inventory
read, the layout with what pods hold, the preference between nodes, the waiting reasons."""

from __future__ import annotations

import json

from tessera.core.mig import MigGpu, Partition, choose
from tessera.core.model import Node
from tessera.kube.mig import (
    MigHold,
    MigView,
    NodeMigGpu,
    apply_choice,
    blocked,
    hold_from_json,
    layout,
    mig_gpus,
)


def inventory(*gpus: dict[str, object]) -> str:
    return json.dumps({"gpus": list(gpus), "links": []})


def test_inventory_lists_mig_gpus_of_known_models_only() -> None:
    text = inventory(
        {"index": 0, "uuid": "GPU-a", "model": "A100-40GB", "mig": True, "partitions": [
            {"profile": "3g.20gb", "start": 0, "uuid": "MIG-1", "managed": True},
            {"profile": "1g.5gb+me", "start": 6, "uuid": "MIG-2", "managed": False}]},
        {"index": 1, "uuid": "GPU-b", "model": "A100-40GB", "mig": False},
        {"index": 2, "uuid": "GPU-c", "model": "V100-16GB", "mig": True})
    assert mig_gpus(text) == (NodeMigGpu("GPU-a", 0, "A100-40GB", (
        Partition("3g.20gb", 0, False, "MIG-1"), Partition("1g.5gb", 6, True, "MIG-2"))),)
    assert mig_gpus("") == () and mig_gpus("{not json") == () and mig_gpus('{"gpus": 3}') == ()


def test_layout_marks_held_slots_busy_and_drops_what_they_remove() -> None:
    gpu = NodeMigGpu("GPU-a", 0, "A100-40GB", (
        Partition("3g.20gb", 0, False, "MIG-idle"), Partition("1g.5gb", 4, False, "MIG-small"),
        Partition("1g.5gb", 6, True, "MIG-operator")))
    # A pod given a 2g.10gb at slot 4: the idle 1g.5gb there goes, the operator's stays.
    [g] = layout([gpu], [MigHold("GPU-a", "2g.10gb", 4)])
    assert g.partitions == (Partition("3g.20gb", 0, False, "MIG-idle"),
                            Partition("2g.10gb", 4, True), Partition("1g.5gb", 6, True,
                                                                     "MIG-operator"))
    # A pod reusing the idle 3g.20gb keeps its UUID; another GPU's holds change nothing.
    [g] = layout([gpu], [MigHold("GPU-a", "3g.20gb", 0), MigHold("GPU-z", "7g.40gb", 0)])
    assert g.partitions[0] == Partition("3g.20gb", 0, True, "MIG-idle")
    # A pod that asked for the idle ones at 0 and 4 to be removed for a 4g.20gb at 0.
    [g] = layout([gpu], [MigHold("GPU-a", "4g.20gb", 0, (0, 4))])
    assert [(p.profile, p.start, p.busy) for p in g.partitions] == [
        ("4g.20gb", 0, True), ("1g.5gb", 6, True)]


def test_a_hold_is_blocked_only_by_an_operators_partition_over_its_slot() -> None:
    gpu = NodeMigGpu("GPU-a", 0, "A100-40GB", (
        Partition("1g.5gb", 6, True, "MIG-operator"), Partition("1g.5gb", 0, False, "MIG-idle")))
    # 2g.10gb at 6 covers slots 6-7: the operator's 1g.5gb at 6 is in the way for good.
    assert blocked([gpu], MigHold("GPU-a", "2g.10gb", 6)) == gpu.partitions[0]
    # tessera's idle partition at 0 is removed when the pod's partition is made: not blocked.
    assert blocked([gpu], MigHold("GPU-a", "3g.20gb", 0)) is None
    # Slots 4-5 are free; another GPU's hold, or an unknown profile, is not judged here.
    assert blocked([gpu], MigHold("GPU-a", "1g.10gb", 4)) is None
    assert blocked([gpu], MigHold("GPU-z", "2g.10gb", 6)) is None
    assert blocked([gpu], MigHold("GPU-a", "9g.99gb", 6)) is None
    # A partition of the hold's own profile and slot may be its own, seen before the journal.
    assert blocked([gpu], MigHold("GPU-a", "1g.5gb", 6)) is None


def test_hold_round_trips_and_the_choice_is_seen_by_the_next_pod() -> None:
    hold = MigHold("GPU-a", "3g.20gb", 4, (0,))
    assert hold_from_json(hold.to_json()) == hold
    gpus = [MigGpu("GPU-a", "A100-40GB")]
    first = apply_choice(gpus, "3g.20gb", choose(gpus, "3g.20gb"))  # type: ignore[arg-type]
    second = apply_choice(gpus, "3g.20gb", choose(gpus, "3g.20gb"))  # type: ignore[arg-type]
    assert {first.start, second.start} == {0, 4}
    assert choose(gpus, "3g.20gb") is None


def test_nodes_preferred_reuse_then_cut_then_intact_then_removal() -> None:
    a100 = "A100-40GB"
    view = MigView.build({
        "reuse": (NodeMigGpu("G1", 0, a100, (Partition("3g.20gb", 4, False, "MIG-i"),)),),
        "cut": (NodeMigGpu("G2", 0, a100, (Partition("1g.5gb", 0, True, "MIG-o"),)),),
        "intact": (NodeMigGpu("G3", 0, a100),),
        "remove": (NodeMigGpu("G4", 0, a100, (Partition("7g.40gb", 0, False, "MIG-w"),)),),
        "full": (NodeMigGpu("G5", 0, a100, (Partition("7g.40gb", 0, True, "MIG-x"),)),),
    }, [])
    room, _ = view.room("3g.20gb")
    assert sorted(room, key=lambda n: -room[n]) == ["reuse", "cut", "intact", "remove"]
    c = view.constraint(None, "3g.20gb")
    assert c is view.constraint(None, "3g.20gb") and c != MigView().constraint(None, "3g.20gb")
    assert not c.allows(Node("full")) and c.allows(Node("intact"))
    assert c.score(Node("reuse")) > c.score(Node("cut")) > c.score(Node("remove"))
    assert c.refusals((Node("full"), Node("intact"))) == (
        "1 no room for MIG 3g.20gb on their MIG GPUs (cut A100-40GB: 1g.5gb@0 busy; full "
        "A100-40GB: 7g.40gb@0 busy; intact A100-40GB: not cut; remove A100-40GB: 7g.40gb@0 "
        "idle; reuse A100-40GB: 3g.20gb@4 idle)")


def test_reasons_name_the_profile_and_what_exists() -> None:
    view = MigView.build({"n": (NodeMigGpu("G", 0, "A100-40GB"),)}, [])
    assert view.room("3g.40gb") == ({}, "no GPU in MIG mode has profile 3g.40gb (MIG profiles "
                                        "here: A100-40GB: 1g.5gb, 1g.10gb, 2g.10gb, 3g.20gb, "
                                        "4g.20gb, 7g.40gb)")
    assert MigView().room("1g.5gb") == ({}, "no GPU in MIG mode in the cluster for MIG 1g.5gb")

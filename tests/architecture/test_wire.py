"""The wire between the scheduler (and webhook) and tessera-node (tessera.wire): each codec
reads back what it writes, tessera-node reads what the scheduler writes, and neither side keeps
its own copy of a name again."""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tessera import wire
from tessera.core.state import Placement
from tessera.kube import names
from tessera.node.agent_options import PodView
from tessera.node.kube_mig import want_of
from tessera.node.sync.share_files import share_of

SRC = Path(__file__).resolve().parents[2] / "src" / "tessera"

sizes = st.integers(min_value=0, max_value=2**50)


@st.composite
def placements(draw: st.DrawFn) -> Placement:
    n = draw(st.integers(min_value=0, max_value=8))
    return Placement(
        node=draw(st.text(min_size=1, max_size=20)),
        devices=tuple(draw(st.lists(st.integers(0, 63), min_size=n, max_size=n))),
        request_bytes=tuple(draw(st.lists(sizes, min_size=n, max_size=n))),
        limit_bytes=tuple(draw(st.lists(sizes, min_size=n, max_size=n))),
        exclusive=draw(st.booleans()), cpu_milli=draw(st.integers(0, 10**6)),
        memory=draw(sizes),
        gpus=draw(st.none() | st.floats(min_value=0, max_value=64, allow_nan=False)))


@given(placements())
def test_a_placement_reads_back_as_written(p: Placement) -> None:
    assert wire.placement_from_json(wire.placement_to_json(p)) == p


@given(st.text(min_size=1), st.text(min_size=1), st.integers(0, 7),
       st.lists(st.integers(0, 7), max_size=7))
def test_a_mig_hold_reads_back_as_written(gpu: str, profile: str, start: int,
                                          remove: list[int]) -> None:
    hold = wire.MigHold(gpu, profile, start, tuple(remove))
    assert wire.hold_from_json(hold.to_json()) == hold


@given(sizes, sizes)
def test_a_mig_share_reads_back_as_written(request: int, limit: int) -> None:
    share = wire.MigShare(request, limit)
    assert wire.mig_share_from_json(share.to_json()) == share


def test_tessera_node_reads_the_share_the_scheduler_writes(tmp_path: Path) -> None:
    placement = Placement("n1", devices=(0, 3), request_bytes=(2**30, 3 * 2**30),
                          limit_bytes=(2 * 2**30, 4 * 2**30))
    pod = PodView("ns", "p", "uid", {
        names.GPU_CONFIG_KEY: "0123456789abcdef", names.PLACEMENT: wire.placement_to_json(placement),
        names.NODE_GPU_UUIDS: "GPU-a,GPU-b"}, {}, [], False)
    share = share_of(pod, tmp_path)
    assert share is not None
    assert [(d.uuid, d.request_bytes, d.limit_bytes) for d in share.devices] == [
        ("GPU-a", 2**30, 2 * 2**30), ("GPU-b", 3 * 2**30, 4 * 2**30)]


def test_tessera_node_reads_the_partition_the_scheduler_writes() -> None:
    hold = wire.MigHold("GPU-1", "3g.20gb", 4, (0, 2))
    want = want_of("ns", "p", "uid", {names.MIG_PARTITION: hold.to_json()})
    assert want is not None
    assert (want.gpu, want.profile, want.start, want.remove) == (
        hold.gpu, hold.profile, hold.start, hold.remove)


def test_no_module_of_either_side_spells_a_wire_name_itself() -> None:
    """A name on the wire is written once, in tessera.wire; a string literal equal to one in
    tessera.kube or tessera.node is a copy waiting to drift."""
    values = {v: k for k, v in vars(wire).items() if k.isupper() and isinstance(v, str)}
    found = []
    for part in ("kube", "node"):
        for path in sorted((SRC / part).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and node.value in values:
                    found.append(f"{path.relative_to(SRC)}:{node.lineno} spells "
                                 f"{node.value!r}: use tessera.wire.{values[node.value]}")
    assert found == []


def test_every_writer_builds_its_events_with_the_one_builder() -> None:
    body = wire.event_body(kind="Pod", name="p" * 300, namespace="", uid="u", reason="R",
                           message="m" * 2000, type_="Warning", component="tessera-node",
                           instance="n1", host="n1")
    assert body["metadata"] == {"generateName": "p" * 200 + ".", "namespace": "default"}
    assert len(body["message"]) == 1000 and body["source"] == {"component": "tessera-node",
                                                               "host": "n1"}
    assert "host" not in wire.event_body(kind="Pod", name="p", namespace="ns", uid="u",
                                         reason="R", message="m", type_="Normal",
                                         component="c", instance="c")["source"]
    hand_built = []
    for part in ("kube", "node"):
        for path in sorted((SRC / part).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Dict) and any(
                        isinstance(k, ast.Constant) and k.value == "involvedObject"
                        for k in node.keys):
                    hand_built.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert hand_built == []

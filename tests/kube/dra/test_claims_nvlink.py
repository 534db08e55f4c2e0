"""Device truth where tessera chooses (issue 27, item 8; docs/kube-constraints.md): a DRA claim
for whole GPUs goes through the same core placement as an annotated pod, so its devices are
NVLink-aware, and the allocation tessera writes names exactly those devices (the kubelet then
prepares what the allocation names; nothing else picks). The control: without the node's
topology the same claims span islands."""

from __future__ import annotations

import dataclasses
from typing import Any

from tessera.core import nvlink
from tessera.core.model import ResourceRequest
from tessera.core.placement import Placer
from tessera.core.state import ClusterState, Placement
from tessera.kube.claims import allocation_status, claim_gpu_request
from tests.core.factories import gpu_node

QUADS = (0, 0, 0, 0, 1, 1, 1, 1)


def whole_claim(count: int, uid: str) -> dict[str, Any]:
    return {"metadata": {"name": f"c{uid}", "uid": uid},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.tessera.io", "count": count}}]}}}


def allocate(islands: tuple[int, ...] | None) -> list[list[int]]:
    node = dataclasses.replace(gpu_node("n", gpus=8), nvlink=islands)
    state = ClusterState([node])
    placer = Placer(state, "binpack")
    got = []
    for name, count in (("two", 2), ("four", 4)):
        claim = whole_claim(count, f"u-{name}")
        gpu = claim_gpu_request([claim])
        assert gpu is not None
        where = placer.place(ResourceRequest(gpu))
        assert isinstance(where, Placement), where
        state.assign(name, where)
        st = allocation_status(claim, "gpu", where, gpu, [(f"{name}-pod", f"p-{name}")])
        got.append([int(r["device"].removeprefix("gpu-"))
                    for r in st["allocation"]["devices"]["results"]])
    return got


def test_a_four_gpu_claim_gets_an_intact_nvlink_quad() -> None:
    two, four = allocate(QUADS)
    assert nvlink.one_island(QUADS, two) and nvlink.one_island(QUADS, four), (two, four)


def test_without_the_topology_the_same_claims_span_quads() -> None:
    _, four = allocate(None)
    assert not nvlink.one_island(QUADS, four), four

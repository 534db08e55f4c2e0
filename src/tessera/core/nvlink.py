"""NVLink islands inside one node: which devices a multi-GPU pod can use with NVLink between
every pair.

A node's NVLink topology is kept as one island id per device (``Node.nvlink``): devices joined by
NVLink, directly or through other devices (an NVSwitch joins all of them), share an id; a device
with no NVLink is an island of its own. ``None`` means the topology is unknown (simulated GPUs,
a node whose agent has not reported it): placement then has no NVLink preference there.

Why islands rather than pairs: the devices a pod gets talk through NCCL rings; a set inside one
island keeps every hop on NVLink, one spanning islands puts at least one hop on PCIe. Islands
are also what the NVIDIA topology of real machines is made of (NVSwitch: one island; PCIe cards
with NVLink bridges: pairs; PCIe only: singletons).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def islands(count: int, linked: Iterable[tuple[int, int]]) -> tuple[int, ...]:
    """The island id of each of ``count`` devices, given the NVLink-connected pairs; ids are
    numbered in order of each island's lowest device. Pairs naming a device outside
    ``0..count-1`` are ignored (a stale report must not break placement)."""
    parent = list(range(count))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in linked:
        if 0 <= a < count and 0 <= b < count:
            ra, rb = root(a), root(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    ids: dict[int, int] = {}
    return tuple(ids.setdefault(root(i), len(ids)) for i in range(count))


def one_island(nvlink: Sequence[int] | None, devices: Sequence[int]) -> bool:
    """Whether ``devices`` are all in one island (trivially so for one device)."""
    if nvlink is None or len(devices) < 2:
        return True
    first = nvlink[devices[0]]
    return all(nvlink[i] == first for i in devices)


def split(nvlink: Sequence[int] | None) -> bool:
    """Whether the node has more than one island, so the choice of devices matters."""
    return nvlink is not None and len(set(nvlink)) > 1

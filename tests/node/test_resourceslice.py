"""The ResourceSlice tessera-node publishes (pure part, tessera.node.resourceslice); the
object's acceptance by the real API server is tested in tests/kube/test_node_agent.py."""

from __future__ import annotations

from tessera.core.units import GiB
from tessera.node.headroom import DeviceHeadroom
from tessera.node.nvml import Gpu, Inventory, Link
from tessera.node.resourceslice import (
    DRIVER,
    MiB,
    devices,
    devices_digest,
    resource_slice,
    usable_memory,
)


def inventory(count: int = 4, memory: int = 40 * GiB, nvlink: tuple[tuple[int, int], ...] = ()
              ) -> Inventory:
    gpus = tuple(Gpu(index=i, uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000",
                     name="NVIDIA A100-SXM4-40GB", model="A100-40GB", memory_total=memory,
                     minor=i, mig_enabled=i == 3, compute_capability=(8, 0))
                 for i in range(count))
    links = tuple(Link(a, b, "single", (a, b) in nvlink)
                  for a in range(count) for b in range(a + 1, count))
    return Inventory("570.133.20", "12.8", gpus, links)


def test_usable_memory_is_whole_mib_after_headroom() -> None:
    assert usable_memory(40 * GiB, 0) == 40 * GiB
    assert usable_memory(40 * GiB, 300 * MiB + 5) == 40 * GiB - 301 * MiB
    assert usable_memory(MiB, 2 * MiB) == 0


def test_devices_carry_attributes_capacity_and_islands() -> None:
    inv = inventory(nvlink=((0, 1), (2, 3)))
    room = {0: DeviceHeadroom(inv.gpus[0].uuid, 512 * MiB, "measured")}
    devs = devices(inv, room)
    assert [d["name"] for d in devs] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert [d["attributes"]["nvlinkIsland"]["int"] for d in devs] == [0, 0, 1, 1]
    assert [d["attributes"]["uuid"]["string"] for d in devs] == [g.uuid for g in inv.gpus]
    assert devs[3]["attributes"]["migEnabled"] == {"bool": True}
    mem0, mem1 = (d["capacity"]["memory"] for d in devs[:2])
    assert mem0["value"] == str(40 * GiB - 512 * MiB) == mem0["requestPolicy"]["default"]
    assert mem1["value"] == str(40 * GiB)
    assert mem0["requestPolicy"]["validRange"] == {"min": str(MiB), "step": str(MiB)}
    assert all(d["allowMultipleAllocations"] is True for d in devs)
    assert all(d["capacity"]["shares"]["value"] == "100" for d in devs)


def test_a_gpu_with_nothing_to_share_is_left_out() -> None:
    inv = inventory(count=2)
    room = {1: DeviceHeadroom(inv.gpus[1].uuid, 40 * GiB - MiB, "flag")}
    assert [d["name"] for d in devices(inv, room)] == ["gpu-0"]


def test_slice_object_and_digest() -> None:
    inv = inventory()
    obj = resource_slice("node-a", "uid-1", inv, generation=3)
    assert obj["spec"]["driver"] == DRIVER and obj["spec"]["nodeName"] == "node-a"
    assert obj["spec"]["pool"] == {"name": "node-a", "generation": 3, "resourceSliceCount": 1}
    assert obj["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert devices_digest(devices(inv)) == devices_digest(devices(inventory()))
    assert devices_digest(devices(inv)) != devices_digest(devices(inventory(count=3)))

"""The ResourceSlice tessera-node publishes (pure part, tessera.node.resourceslice); the
object's acceptance by the real API server is tested in tests/kube/node/test_node_agent.py."""

from __future__ import annotations

from tessera.core.mig import PROFILES
from tessera.core.units import GiB
from tessera.node.headroom import DeviceHeadroom
from tessera.node.nvml import Gpu, Inventory, Link
from tessera.node.resourceslice import (
    DRIVER,
    MiB,
    MigOffer,
    devices,
    devices_digest,
    mig_devices,
    parse_mig_device,
    pool_digest,
    pool_slices,
    pool_specs,
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


def _offer(index: int, blocked: tuple[tuple[int, int], ...] = ()) -> MigOffer:
    table = PROFILES["A100-40GB"]
    return MigOffer(index, f"GPU-{index:08x}-0000-0000-0000-000000000000", "A100-40GB",
                    "NVIDIA A100-SXM4-40GB",
                    {**{n: tuple((s, p.slots) for s in p.starts) for n, p in table.items()},
                     "1g.5gb+me": ((0, 1),)},
                    {n: 5 * 1024 for n in table}, blocked)


def test_mig_gpus_are_partitionable_devices_in_slices_of_64() -> None:
    """8 MIG GPUs: 18 placements each (NVIDIA's counts 7+4+3+2+1+1; +me left out), kept per
    GPU in slices of at most 64 devices, the 8 counter sets in a slice of their own."""
    specs = pool_specs(inventory(count=8), None, [_offer(i) for i in range(8)])
    assert sorted(specs) == ["", "-counters-0", "-mig-0", "-mig-1", "-mig-2"]
    assert [len(specs[k]["devices"]) for k in ("-mig-0", "-mig-1", "-mig-2")] == [54, 54, 36]
    assert [c["name"] for c in specs["-counters-0"]["sharedCounters"]] == [
        f"gpu-{i}-mig" for i in range(8)]
    objs = pool_slices("node-a", "uid", specs, generation=2)
    assert {o["spec"]["pool"]["resourceSliceCount"] for o in objs} == {5}
    assert all(("devices" in o["spec"]) != ("sharedCounters" in o["spec"]) for o in objs)
    dev = next(d for d in specs["-mig-0"]["devices"] if d["name"] == "gpu-0-mig-2g10gb-2")
    assert dev["consumesCounters"][0]["counters"] == {
        "memory-slice-2": {"value": "1"}, "memory-slice-3": {"value": "1"},
        "compute-slices": {"value": "2"}}
    assert parse_mig_device("gpu-0-mig-2g10gb-2") == (0, "2g.10gb", 2)
    assert parse_mig_device("gpu-0") is None
    assert pool_digest(specs) != pool_digest(pool_specs(inventory(count=8), None,
                                                        [_offer(i) for i in range(7)]))
    assert pool_specs(inventory(count=1), None, []) == {"": {"devices": devices(
        inventory(count=1))}}


def test_placements_over_blocked_slots_are_not_offered() -> None:
    """A partition another made (or the annotation path holds) at slots 4-7: nothing
    overlapping it is offered; the placements in 0-3 are."""
    names = {d["name"] for d in mig_devices(_offer(0, blocked=((4, 4),)))}
    assert "gpu-0-mig-3g20gb-0" in names and "gpu-0-mig-4g20gb-0" in names
    assert not {n for n in names if n.endswith(("-4", "-5", "-6"))}
    assert "gpu-0-mig-7g40gb-0" not in names

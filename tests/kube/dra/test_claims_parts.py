"""tessera.kube.claims, the pure part: claims to the core's request, refusals naming the field,
the allocation status (its acceptance by the API server: tests/kube/dra/test_dra.py)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuKind, GpuRequest
from tessera.core.state import Placement
from tessera.kube.claims import (
    allocated_placement,
    allocation_status,
    claim_gpu_request,
    claims_mig_profile,
    mig_allocation_status,
    mig_allocations,
    ours,
    ours_mig,
    released,
    share_id,
)


def claim(*requests: dict[str, Any], name: str = "c", **devices: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": "u-1"},
            "spec": {"devices": {"requests": list(requests), **devices}}}


def exactly(cls: str, name: str = "gpu", **kw: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": cls, **kw}}


def share(**capacity: Any) -> dict[str, Any]:
    return exactly("share.gpu.tessera.io", capacity={"requests": capacity})


def test_memory_share_whole_and_portion() -> None:
    r = claim_gpu_request([claim(share(memory="5Gi"))])
    assert r == GpuRequest.of_memory(5 * 2**30)
    r = claim_gpu_request([claim(exactly("share.gpu.tessera.io", count=4,
                                         capacity={"requests": {"memory": "2000001k"}}))])
    assert r is not None and r.devices == 4 and r.memory == 1908 * 2**20  # rounded up to MiB
    assert claim_gpu_request([claim(exactly("gpu.tessera.io", count=2))]) == GpuRequest.whole(2)
    r = claim_gpu_request([claim(share(shares="25"))])
    assert r is not None and r.kind is GpuKind.PORTION and r.portion == Decimal("0.25")


def test_compute_capacity_is_the_shares_compute_request() -> None:
    """``capacity.requests.compute`` (docs/compute-share.md): a quantity of the GPU's time that
    placement counts (Σ ≤ 1 per GPU), in the allocation's consumedCapacity, and read back."""
    r = claim_gpu_request([claim(share(memory="5Gi", compute="600m"))])
    assert r is not None and r.kind is GpuKind.MEMORY and r.compute == Decimal("0.6")
    r = claim_gpu_request([claim(share(shares="50", compute="0.3"))])
    assert r is not None and r.portion == Decimal("0.5") and r.compute == Decimal("0.3")
    c = claim(share(memory="5Gi", compute="600m"))
    c["metadata"]["uid"] = "u-9"
    p = Placement("node-a", devices=(1,), request_bytes=(5 * 2**30,), limit_bytes=(5 * 2**30,),
                  compute=600_000)
    st = allocation_status(c, "gpu", p, GpuRequest.of_memory(5 * 2**30), [("pod-a", "pu-1")])
    assert st["allocation"]["devices"]["results"][0]["consumedCapacity"]["compute"] == "600m"
    c["status"] = st
    held = allocated_placement(c)
    assert held is not None and held.compute == 600_000


def test_claims_of_other_drivers_are_not_tesseras() -> None:
    assert claim_gpu_request([claim(exactly("gpu.nvidia.com"))]) is None
    assert claim_gpu_request([]) is None


@pytest.mark.parametrize("claims, field, words", [
    ([claim(share(memory="lots"))], "capacity.requests.memory", "quantity"),
    ([claim(share(memory="5Gi", shares="10"))], "capacity.requests", "one of them"),
    ([claim(share())], "capacity.requests", "memory"),
    ([claim(share(shares="150"))], "capacity.requests.shares", "1 to 100"),
    ([claim(share(cores="2"))], "capacity.requests.cores", "not a capacity"),
    ([claim(share(memory="1Gi", compute="2"))], "capacity.requests.compute", "[0, 1]"),
    ([claim(share(memory="1Gi", compute="lots"))], "capacity.requests.compute", "[0, 1]"),
    ([claim(share(shares="20", compute="300m"))], "capacity.requests.compute", "may not exceed the shares"),
    ([claim(share(compute="300m"))], "capacity.requests", "memory"),
    ([claim(exactly("gpu.tessera.io", capacity={"requests": {"memory": "1Gi"}}))],
     "capacity", "whole GPUs"),
    ([claim(exactly("gpu.tessera.io", allocationMode="All"))], "allocationMode", "ExactCount"),
    ([claim(share(memory="1Gi"), exactly("gpu.nvidia.com", name="n"))], "spec.devices.requests",
     "mixes gpu.tessera.io device classes with gpu.nvidia.com"),
    ([claim(share(memory="1Gi")), claim(exactly("gpu.nvidia.com"), name="d")],
     "spec.devices.requests", "another driver"),
    ([claim(share(memory="1Gi"), constraints=[{"requests": ["gpu"]}])], "constraints",
     "not supported"),
    ([claim({"name": "f", "firstAvailable": [{"name": "a", "deviceClassName": "gpu.tessera.io"}]})],
     "firstAvailable", "exactly"),
    ([claim(share(memory="1Gi")), claim(share(memory="2Gi"), name="d")], "resourceclaim d",
     "one gpu.tessera.io request"),
])
def test_bad_claims_name_the_field(claims: list[dict[str, Any]], field: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        claim_gpu_request(claims)
    assert field in str(err.value) and words in str(err.value)


def test_allocation_status() -> None:
    c = claim(share(memory="5Gi"))
    p = Placement("node-a", devices=(1, 3), request_bytes=(5 * 2**30, 5 * 2**30),
                  limit_bytes=(5 * 2**30, 5 * 2**30))
    st = allocation_status(c, "gpu", p, GpuRequest.of_memory(5 * 2**30, devices=2),
                           [("pod-a", "pu-1")])
    results = st["allocation"]["devices"]["results"]
    assert [r["device"] for r in results] == ["gpu-1", "gpu-3"]
    assert {r["pool"] for r in results} == {"node-a"}
    assert results[0]["consumedCapacity"] == {"memory": str(5 * 2**30), "shares": "0"}
    assert results[0]["shareID"] == share_id("u-1", 1) != share_id("u-1", 3)
    assert st["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0][
        "values"] == ["node-a"]
    assert st["reservedFor"] == [{"resource": "pods", "name": "pod-a", "uid": "pu-1"}]
    whole = Placement("node-a", devices=(0,), request_bytes=(80 * 2**30,),
                      limit_bytes=(80 * 2**30,), exclusive=True)
    st = allocation_status(c, "gpu", whole, GpuRequest.whole(1), [])
    assert st["allocation"]["devices"]["results"][0]["consumedCapacity"]["shares"] == "100"


def test_released_only_for_tesseras_own_allocations_without_live_pods() -> None:
    from tessera.kube.claims import released
    c = claim(share(memory="5Gi"))
    p = Placement("node-a", devices=(2,), request_bytes=(5 * 2**30,), limit_bytes=(5 * 2**30,))
    c["status"] = allocation_status(c, "gpu", p, GpuRequest.of_memory(5 * 2**30), [("a", "pa")])
    assert not released(c, {"pa", "other"})
    assert released(c, {"other"})
    theirs = {**c, "status": {**c["status"], "allocation": {"devices": {"results": [
        {**c["status"]["allocation"]["devices"]["results"][0], "shareID": "1-2-3"}]}}}}
    assert not released(theirs, set())  # kube-scheduler's allocation: never deallocated here
    assert not released(claim(share(memory="1Gi")), set())  # not allocated


def test_a_pod_allocates_joins_or_waits_for_its_claim() -> None:
    """claim_use: an unallocated claim is allocated by one pod (the others wait naming it); an
    allocation reserved for other live pods is joined on its node; one whose pods are all gone
    waits for the deallocation; another scheduler's allocation is not joined."""
    from tessera.kube.claims import allocated_placement, claim_use
    c = claim(share(memory="5Gi"))
    assert claim_use(c, "pb", {"pa", "pb"}, None) == ("allocate", "")
    use, why = claim_use(c, "pb", {"pa", "pb"}, "a")
    assert use == "wait" and "being allocated for pod a" in why
    p = Placement("node-a", devices=(2,), request_bytes=(5 * 2**30,), limit_bytes=(5 * 2**30,))
    c["status"] = allocation_status(c, "gpu", p, GpuRequest.of_memory(5 * 2**30), [("a", "pa")])
    assert claim_use(c, "pb", {"pa", "pb"}, None) == ("join", "node-a")
    use, why = claim_use(c, "pb", {"pb"}, None)
    assert use == "wait" and "being deallocated" in why
    assert claim_use(c, "pa", {"pa"}, None) == ("allocate", "")  # its own, a bind not finished
    assert allocated_placement(c) == p
    theirs = {**c, "status": {**c["status"], "allocation": {"devices": {"results": [
        {**c["status"]["allocation"]["devices"]["results"][0], "shareID": "1-2-3"}]}}}}
    use, why = claim_use(theirs, "pb", {"pa", "pb"}, None)
    assert use == "wait" and "allocated by another scheduler" in why
    assert allocated_placement(theirs) is None


def mig(*exprs: str, **kw: Any) -> dict[str, Any]:
    return exactly("mig.tessera.io", name="mig",
                   selectors=[{"cel": {"expression": e}} for e in exprs], **kw)


def test_mig_claims_name_a_profile_in_one_selector() -> None:
    for expr in ('device.attributes["gpu.tessera.io"].profile == "3g.20gb"',
                 "device.attributes['gpu.tessera.io'].profile=='MIG 3g.20gb'"):
        c = claim(mig(expr))
        assert claims_mig_profile([c]) == "3g.20gb"
        assert claim_gpu_request([c]) == GpuRequest.none()  # counted as the profile's fraction
    assert claims_mig_profile([claim(share(memory="1Gi"))]) is None


@pytest.mark.parametrize("request_, field, words", [
    (mig(), "spec.devices.requests[0].exactly.selectors", "exactly one CEL selector"),
    (mig('device.attributes["gpu.tessera.io"].profile != "3g.20gb"'), "selectors",
     'profile == "3g.20gb"'),
    (mig('device.attributes["gpu.tessera.io"].profile == "3g.20gb"',
         'device.attributes["gpu.tessera.io"].parentIndex == 0'), "selectors", "exactly one"),
    (mig('device.attributes["gpu.tessera.io"].profile == "banana"'),
     "selectors[0].cel.expression", "MIG profile"),
    (mig('device.attributes["gpu.tessera.io"].profile == "9g.90gb"'),
     "selectors[0].cel.expression", "not a MIG profile of any GPU tessera knows (1g.5gb"),
    (mig('device.attributes["gpu.tessera.io"].profile == "1g.5gb"', count=2), "count",
     "one mig.tessera.io partition per request"),
])
def test_mig_claims_tessera_does_not_allocate_are_refused(
        request_: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        claim_gpu_request([claim(request_)])
    assert field in str(err.value) and words in str(err.value), str(err.value)
    assert "resourceclaim c" in str(err.value)


def test_mig_allocation_is_the_placements_device_and_tesseras_own() -> None:
    c = claim(mig('device.attributes["gpu.tessera.io"].profile == "3g.20gb"'))
    c["status"] = mig_allocation_status(c, "mig", "node-a", 1, "3g.20gb", 4, [("p", "pod-uid")])
    (r,) = c["status"]["allocation"]["devices"]["results"]
    assert r == {"request": "mig", "driver": "gpu.tessera.io", "pool": "node-a",
                 "device": "gpu-1-mig-3g20gb-4"}  # no shareID: a partition is not shared
    assert mig_allocations(c) == [("node-a", 1, "3g.20gb", 4)]
    assert ours_mig(c) and not ours(c)
    assert not released(c, {"pod-uid"}) and released(c, set())
    c["status"]["reservedFor"] = []  # another allocator's, its binding under way: left alone
    assert ours_mig(c) and not released(c, set())
    c["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "pod-uid"}]
    # kube-scheduler's allocation of the same device carries its protection finalizer.
    c["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    assert not ours_mig(c) and not released(c, set())
    assert mig_allocations(c) == [("node-a", 1, "3g.20gb", 4)]  # still holds the placement


def limit_config(value: Any = "800m", **params: Any) -> list[dict[str, Any]]:
    base = {"apiVersion": "gpu.tessera.io/v1", "kind": "ComputeShare", "computeLimit": value}
    base.update(params)
    return [{"requests": ["gpu"], "opaque": {"driver": "gpu.tessera.io", "parameters": base}}]


def test_a_compute_limit_is_the_claims_opaque_config() -> None:
    """The burst ceiling beside capacity.requests.compute (docs/compute-share.md): placement
    counts only the request, so the request is unchanged; the kubelet plugin writes the limit
    (tests/node/test_draplugin_compute.py)."""
    from tessera.core.compute_claim import compute_limit

    c = claim(share(shares="50", compute="300m"), config=limit_config("800m"))
    r = claim_gpu_request([c])
    assert r is not None and r.compute == Decimal("0.3")
    assert compute_limit(c, r.compute) == Decimal("0.8")
    assert compute_limit(claim(share(shares="50", compute="300m")), Decimal("0.3")) is None


@pytest.mark.parametrize("config, field, words", [
    (limit_config("1.5"), "config[0].opaque.parameters.computeLimit", "[0, 1]"),
    (limit_config("200m"), "config[0].opaque.parameters.computeLimit", "at least the compute request (0.3)"),
    (limit_config("lots"), "config[0].opaque.parameters.computeLimit", "[0, 1]"),
    (limit_config("800m", computeMode="strict"), "config[0].opaque.parameters.computeMode",
     "not a field of ComputeShare"),
    (limit_config("800m", kind="GpuConfig"), "config[0].opaque.parameters", "kind ComputeShare"),
    ([{"opaque": {"driver": "gpu.nvidia.com", "parameters": {}}}], "config[0].opaque.driver",
     "only an opaque config of driver gpu.tessera.io"),
    (limit_config() + limit_config(), "config[1]", "one ComputeShare config"),
    ([{"opaque": {"driver": "gpu.tessera.io", "parameters": {"apiVersion": "gpu.tessera.io/v1",
                                                             "kind": "ComputeShare"}}}],
     "config[0].opaque.parameters.computeLimit", "is required"),
])
def test_bad_compute_limits_name_the_field(config: list[dict[str, Any]], field: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        claim_gpu_request([claim(share(shares="50", compute="300m"), config=config)])
    assert f"resourceclaim c: spec.devices.{field}" in str(err.value) and words in str(err.value)


def test_a_compute_limit_needs_a_compute_request() -> None:
    for c in (claim(share(memory="1Gi"), config=limit_config()),
              claim(exactly("gpu.tessera.io"), config=limit_config())):
        with pytest.raises(InvalidRequest) as err:
            claim_gpu_request([c])
        assert "computeLimit" in str(err.value) and "needs a compute request" in str(err.value)

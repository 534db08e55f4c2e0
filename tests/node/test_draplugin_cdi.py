"""The kubelet plugin's pure parts (tessera.node.draplugin.cdi, .plugin): what a claim's
allocation gives a container, and each refusal named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tessera.core.errors import InvalidRequest
from tessera.node.draplugin import dra_pb2
from tessera.node.draplugin.cdi import (
    PluginConfig,
    cdi_spec,
    claim_devices,
    pods_group,
    pods_priority_class,
)
from tessera.node.draplugin.plugin import DraPlugin


def cfg(**kw: Any) -> PluginConfig:
    return PluginConfig(node="n", uuids={0: "GPU-a", 1: "GPU-b"}, cdi_dir=Path("/cdi"),
                        library_dir=Path("/lib"), **kw)


def claim(*results: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "c", "namespace": "ns", "uid": "u-1"},
            "status": {"allocation": {"devices": {"results": list(results)}}}}


def result(device: str = "gpu-0", request: str = "gpu", memory: str | None = "5Gi",
           pool: str = "n") -> dict[str, Any]:
    r: dict[str, Any] = {"request": request, "driver": "gpu.tessera.io", "pool": pool,
                         "device": device}
    if memory is not None:
        r["consumedCapacity"] = {"memory": memory}
    return r


def test_two_devices_are_visible_in_the_claims_order_each_with_its_limit() -> None:
    devs = claim_devices(claim(result("gpu-1"), result("gpu-0", memory="1Gi")), cfg())
    spec = cdi_spec("u-1", devs, cfg())
    assert "NVIDIA_VISIBLE_DEVICES=GPU-b,GPU-a" in spec["containerEdits"]["env"]
    assert [d["containerEdits"]["env"] for d in spec["devices"]] == [
        [f"TESSERA_GPU_MEMORY_LIMIT_0={5 * 2**30}"], [f"TESSERA_GPU_MEMORY_LIMIT_1={2**30}"]]


@pytest.mark.parametrize(("results", "field", "words"), [
    ([result(memory=None)], "consumedCapacity.memory", "no limit"),
    ([result(memory="0")], "consumedCapacity.memory", "greater than 0"),
    ([result(device="gpu-7")], "results.device", "does not list"),
    ([result(pool="m")], "results.pool", "not this node"),
    ([result("gpu-0", "a"), result("gpu-1", "b")], "results.request", "one request per claim"),
    ([result("gpu-0"), result("gpu-0")], "results.device", "one GPU twice"),
    ([], "status.allocation", "not allocated"),
])
def test_an_allocation_that_cannot_be_enforced_is_refused_naming_the_field(
        results: list[dict[str, Any]], field: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        claim_devices(claim(*results), cfg())
    assert field in str(err.value) and words in str(err.value)


def test_prepare_on_a_node_not_ready_is_an_error_for_the_claim(tmp_path: Path) -> None:
    plugin = DraPlugin(cfg(not_ready="isolation library missing"), lambda ns, n: claim(result()))
    req = dra_pb2.NodePrepareResourcesRequest(
        claims=[dra_pb2.Claim(namespace="ns", name="c", uid="u-1")])
    got = plugin.NodePrepareResources(req, None).claims["u-1"]
    assert "not ready for GPU shares: isolation library missing" in got.error
    assert not got.devices


def test_the_regions_group_is_the_one_the_claims_pods_agree_on() -> None:
    def pod(sc: dict[str, Any], claim_name: str = "c") -> dict[str, Any]:
        return {"spec": {"securityContext": sc,
                         "resourceClaims": [{"name": "g", "resourceClaimName": claim_name}],
                         "containers": [{"name": "m", "resources": {"claims": [{"name": "g"}]}},
                                        {"name": "side"}]}}
    assert pods_group([pod({"fsGroup": 7}), pod({"supplementalGroups": [7]})], "c") == 7
    assert pods_group([pod({"fsGroup": 7}), pod({"fsGroup": 8})], "c") is None
    assert pods_group([pod({})], "c") is None
    assert pods_group([pod({"fsGroup": 7}, "other")], "c") is None


def test_a_relative_plugin_directory_is_refused_at_start_naming_the_flag(
        capsys: pytest.CaptureFixture[str]) -> None:
    from tessera.node.cli import main

    assert main(["run", "--node-name=n", "--cdi-dir=cdi"]) == 2
    assert "--cdi-dir: must be an absolute path (got 'cdi')" in capsys.readouterr().err


def test_the_loans_priority_is_the_class_the_claims_pods_agree_on() -> None:
    def pod(ann: str | None = None, spec: str | None = None) -> dict[str, Any]:
        return {"metadata": {"annotations": {"tessera.io/priority-class": ann} if ann else {}},
                "spec": {"priorityClassName": spec} if spec else {}}
    assert pods_priority_class([pod("inference"), pod(spec="inference")]) == "inference"
    assert pods_priority_class([pod("inference"), pod("build")]) == ""
    assert pods_priority_class([pod(spec="system-node-critical")]) == ""  # not tessera's
    assert pods_priority_class([]) == ""


def test_a_whole_gpu_allocated_without_consumable_capacity_gets_all_its_memory() -> None:
    """An API server without DRAConsumableCapacity drops consumedCapacity and shareID and gives
    the GPU to one claim alone (docs/dra.md): prepared with the GPU's whole memory as the limit;
    with a shareID but no consumed memory, or a GPU NVML gave no size for, still refused."""
    whole = cfg(memory={"GPU-a": 80 * 2**30})
    (dev,) = claim_devices(claim(result(memory=None)), whole)
    assert dev.limit_bytes == 80 * 2**30
    shared = {**result(memory=None), "shareID": "s-1"}
    with pytest.raises(InvalidRequest, match="no limit to enforce"):
        claim_devices(claim(shared), whole)
    with pytest.raises(InvalidRequest, match="no limit to enforce"):
        claim_devices(claim(result("gpu-1", memory=None)), whole)

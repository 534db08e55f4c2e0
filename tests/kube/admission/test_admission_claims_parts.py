"""The webhook's rewrite of old-style GPU requests into ResourceClaims, as pure functions: the
claim a rewritten pod asks for reads back, through tessera-scheduler's claim parser, as the
request the old spelling made; nothing of the annotation path's wiring is left on the pod."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuRequest
from tessera.core.units import GiB, MiB
from tessera.kube import claims as kube_claims
from tessera.kube import names
from tessera.kube.admission import claims, mutate, policy
from tessera.kube.admission.policy import WebhookConfig
from tests.kube.spelling_helpers import VIEW, pod

ON = WebhookConfig(rewrite_claims=True)


def rewritten(manifest: dict[str, Any]) -> tuple[dict[str, Any], claims.Template]:
    out, template = mutate.admitted(manifest, "ns", VIEW, ON)
    assert out is not None and template is not None
    return out, template


def parsed(template: claims.Template) -> GpuRequest:
    claim = {"metadata": {"name": "c"}, "spec": template.spec}
    got = kube_claims.claim_gpu_request([claim])
    assert got is not None
    return got


@given(st.integers(1, 99), st.integers(1, 4))
def test_a_fraction_becomes_shares(hundredths: int, devices: int) -> None:
    p = Decimal(hundredths) / 100
    _, template = rewritten(pod({"gpu-fraction": str(p),
                                   "gpu-fraction-num-devices": str(devices)}))
    assert parsed(template) == GpuRequest.fraction(p, devices)
    assert template.spec["devices"]["requests"][0]["exactly"]["capacity"] == {
        "requests": {"shares": str(hundredths)}}


def test_a_fraction_below_a_hundredth_is_rounded_up() -> None:
    _, template = rewritten(pod({"gpu-fraction": "0.125"}))
    assert parsed(template) == GpuRequest.fraction(Decimal("0.13"))


@given(st.integers(1, 81559))
def test_runai_memory_becomes_bytes(mib: int) -> None:
    _, template = rewritten(pod({"gpu-memory": str(mib)}))
    assert parsed(template) == GpuRequest.of_memory(mib * MiB)
    assert template.spec["devices"]["requests"][0]["exactly"]["capacity"] == {
        "requests": {"memory": str(mib * MiB)}}


def test_cgpu_and_whole_gpus() -> None:
    _, cgpu = rewritten(pod(labels={"aliyun.com/gpu-count": "4"},
                            resources={"limits": {"aliyun.com/gpu-mem": 8}}))
    assert parsed(cgpu) == GpuRequest.of_memory(2 * GiB, devices=4)
    manifest = pod(resources={"limits": {"nvidia.com/gpu": 2, "cpu": "1"}})
    manifest["spec"]["schedulerName"] = "tessera"
    out, whole = rewritten(manifest)
    assert parsed(whole) == GpuRequest.whole(2)
    assert whole.spec["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "gpu.tessera.io", "allocationMode": "ExactCount", "count": 2}
    assert out["spec"]["containers"][0]["resources"] == {"limits": {"cpu": "1"},
                                                         "claims": [{"name": "tessera-gpu"}]}


def test_the_template_name_follows_the_shape_only() -> None:
    a = rewritten(pod({"gpu-fraction": "0.5"}))[1]
    b = rewritten(pod({names.GPU_PORTION: "0.5"}))[1]
    c = rewritten(pod({"gpu-fraction": "0.25"}))[1]
    assert a == b and a.name != c.name and a.name.startswith("tessera-gpu-")


def test_a_rewritten_pod_carries_the_claim_and_none_of_the_old_wiring() -> None:
    manifest = pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "main"},
                   env=[{"name": "RUNAI_GPU_MEMORY_LIMIT", "value": "0.5"}, {"name": "A",
                                                                             "value": "1"}])
    manifest["spec"]["containers"].append({"name": "side", "image": "busybox"})
    manifest["metadata"]["generateName"] = "job-"
    del manifest["metadata"]["name"]
    out, template = rewritten(manifest)
    spec, ann = out["spec"], out["metadata"]["annotations"]
    assert spec["resourceClaims"] == [{"name": "tessera-gpu",
                                       "resourceClaimTemplateName": template.name}]
    main, side = spec["containers"]
    assert main["resources"]["claims"] == [{"name": "tessera-gpu"}]
    assert main["env"] == [{"name": "A", "value": "1"}]     # no ConfigMap, no isolation env
    assert "volumeMounts" not in main and "volumes" not in spec
    assert side["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    assert "securityContext" not in spec                      # no region group
    assert ann == {names.PROJECT: "team-a"}                   # old request gone, no config key
    assert spec["schedulerName"] == "tessera"
    assert "name" not in out["metadata"]                      # no ConfigMap name to fix
    policy.check_final(out, "ns", VIEW, ON)                   # the validating webhook agrees


@pytest.mark.parametrize(("manifest", "message"), [
    (pod({"gpu-fraction": "1.5"}),
     r"metadata.annotations\[gpu-fraction\]: must be a decimal GPU portion in \(0, 1\)"),
    (pod({"gpu-memory": "5G"}), r"metadata.annotations\[gpu-memory\]: must be a positive whole"),
    (pod(labels={"aliyun.com/gpu-count": "3"}, resources={"limits": {"aliyun.com/gpu-mem": 8}}),
     r"resources.limits\[aliyun.com/gpu-mem\]: must divide evenly"),
    (pod({"gpu-fraction": "0.5", "gpu-fraction-limit": "0.8"}),
     r"metadata.annotations\[gpu-fraction-limit\]: a GPU limit above the request cannot be "
     r"written in a ResourceClaim"),
    (pod({"gpu-memory": "4000"}, env=[{"name": "RUNAI_GPU_MEMORY_LIMIT", "value": "8G"}]),
     r"env\[RUNAI_GPU_MEMORY_LIMIT\]: a GPU limit above the request"),
    (pod({names.GPU_PORTION: "0.5", names.GPU_MODEL: "H100-80GB"}),
     r"metadata.annotations\[tessera.io/gpu-model\]: cannot be written in a ResourceClaim"),
    (pod({"gpu-fraction-num-devices": "16", "gpu-fraction": "0.5"}),
     r"gpu-fraction-num-devices\]: asks for 16 GPUs on one node"),
])
def test_bad_requests_are_refused_naming_the_field(manifest: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        mutate.admitted(manifest, "ns", VIEW, ON)


def test_old_requests_beside_own_claims_or_in_two_containers_are_refused() -> None:
    manifest = pod({"gpu-fraction": "0.5"})
    manifest["spec"]["resourceClaims"] = [{"name": "mine", "resourceClaimName": "x"}]
    with pytest.raises(InvalidRequest, match=r"spec.resourceClaims: a pod asking for GPUs the "
                       r"old way \(metadata.annotations\[gpu-fraction\]\) must not name"):
        mutate.admitted(manifest, "ns", VIEW, ON)
    two = pod(resources={"limits": {"nvidia.com/gpu": 1}})
    two["spec"]["schedulerName"] = "tessera"
    two["spec"]["containers"].append({"name": "b", "image": "x",
                                      "resources": {"limits": {"nvidia.com/gpu": 1}}})
    with pytest.raises(InvalidRequest, match=r"spec.containers\[b\].resources.limits"
                       r"\[nvidia.com/gpu\]: whole GPUs in more than one container"):
        mutate.admitted(two, "ns", VIEW, ON)


def test_rewrite_off_is_the_annotation_path() -> None:
    manifest = pod({"gpu-fraction": "0.5"})
    assert mutate.admitted(manifest, "ns", VIEW, WebhookConfig())[1] is None
    assert mutate.mutated(manifest, "ns", VIEW, WebhookConfig()) is not None


def test_stored_templates_compare_by_value() -> None:
    template = claims.template_for(GpuRequest.of_memory(5000 * MiB))
    stored = {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "share.gpu.tessera.io", "allocationMode": "ExactCount", "count": 1,
        "capacity": {"requests": {"memory": "5242880k"}}}}]}}
    assert claims.same_spec(stored, template.spec)
    stored["devices"]["requests"][0]["exactly"]["count"] = 2
    assert not claims.same_spec(stored, template.spec)

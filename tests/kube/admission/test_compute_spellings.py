"""The webhook's compute-share spellings (tessera.kube.admission.compute_spellings)."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuRequest
from tessera.kube.admission.compute_spellings import ENFORCED, canonical, not_enforced_multi_gpu

HALF = GpuRequest.fraction("0.5")


def pod(ann: dict[str, str] | None = None, limits: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"annotations": ann or {}},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits or {}}}]}}


def test_tessera_annotations_are_kept_canonical() -> None:
    out = canonical(pod({"tessera.io/gpu-compute-request": "0.3", "tessera.io/gpu-compute-limit": "0.8"}), HALF,
                    mig=False, cluster_mode="fair")
    assert out == {"tessera.io/gpu-compute-request": "0.3", "tessera.io/gpu-compute-limit": "0.8",
                   "tessera.io/gpu-compute-mode": "fair",
                   "tessera.io/gpu-compute-status": ENFORCED}
    two = canonical(pod({"tessera.io/gpu-compute-request": "0.3"}), GpuRequest.fraction("0.5", devices=2),
                    mig=False, cluster_mode="fair")
    assert two["tessera.io/gpu-compute-status"] == not_enforced_multi_gpu(2)
    assert two["tessera.io/gpu-compute-status"].startswith("not enforced: multi-GPU (2 GPUs")


def test_defaults_from_the_portion() -> None:
    assert canonical(pod(), HALF, mig=False, cluster_mode="strict")["tessera.io/gpu-compute-limit"] == "0.5"
    assert canonical(pod(), HALF, mig=False, cluster_mode="off") == {}


def test_hami_gpucores_becomes_request_and_limit() -> None:
    out = canonical(pod(limits={"nvidia.com/gpucores": 30}), HALF, mig=False, cluster_mode="fair")
    assert out["tessera.io/gpu-compute-request"] == "0.3" and out["tessera.io/gpu-compute-limit"] == "0.3"
    with pytest.raises(InvalidRequest) as e:
        canonical(pod(limits={"nvidia.com/gpucores": 300}), HALF, mig=False, cluster_mode="fair")
    assert e.value.field == "spec.containers[0].resources.limits[nvidia.com/gpucores]"


def test_kai_mode_annotation() -> None:
    out = canonical(pod({"nvidia.com/container.main.gpu-compute.mode": "time-slicing"}), HALF, mig=False,
                    cluster_mode="strict")
    assert out["tessera.io/gpu-compute-mode"] == "fair"
    with pytest.raises(InvalidRequest, match="sm-sharing"):
        canonical(pod({"kai.scheduler/gpu-compute-sharing-mode": "sm-sharing"}), HALF, mig=False,
                  cluster_mode="fair")


def test_refusals_name_the_annotation() -> None:
    with pytest.raises(InvalidRequest) as e:
        canonical(pod({"tessera.io/gpu-compute-request": "0.3"}), HALF, mig=False, cluster_mode="off")
    assert e.value.field == "metadata.annotations[tessera.io/gpu-compute-request]"
    with pytest.raises(InvalidRequest, match="whole GPUs"):
        canonical(pod({"tessera.io/gpu-compute-request": "0.3"}), GpuRequest.whole(1), mig=False,
                  cluster_mode="fair")


def test_the_workload_document_shows_the_pods_compute_share() -> None:
    from tessera.kube.admission.compute_spellings import share_doc

    ann = canonical(pod({"tessera.io/gpu-compute-request": "0.3"}), HALF, mig=False, cluster_mode="fair")
    doc = share_doc(ann)
    assert doc is not None and doc["text"] == f"request 0.3, limit 1 (fair); {ENFORCED}"
    assert share_doc({}) is None

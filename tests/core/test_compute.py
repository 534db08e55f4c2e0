"""Compute share rules (tessera.core.compute): defaults, validation naming the field, counting."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tessera.core import compute
from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuRequest

HALF = GpuRequest.fraction("0.5")
MEM = GpuRequest.of_memory(8 * 2**30)


def test_defaults_follow_run_ai() -> None:
    assert compute.resolve(HALF, cluster_mode="fair") == compute.ComputeShare(Decimal("0.5"), Decimal(1), "fair")
    assert compute.resolve(HALF, cluster_mode="strict") == compute.ComputeShare(Decimal("0.5"), Decimal("0.5"),
                                                                                "strict")
    assert compute.resolve(MEM, cluster_mode="strict") == compute.ComputeShare(Decimal(0), Decimal(1), "strict")
    assert compute.resolve(HALF, cluster_mode="off") is None
    assert compute.resolve(GpuRequest.whole(1), cluster_mode="fair") is None  # whole GPUs: not gated


def test_explicit_request_and_limit() -> None:
    s = compute.resolve(MEM, request="0.3", limit="0.6", cluster_mode="fair", names=compute.CLI)
    assert s == compute.ComputeShare(Decimal("0.3"), Decimal("0.6"), "fair", explicit=True)
    assert compute.resolve(HALF, mode="strict", cluster_mode="fair").limit == Decimal("0.5")


@pytest.mark.parametrize("kw, field, rule", [
    ({"request": "1.5"}, "--gpu-compute-request", "[0, 1]"),
    ({"request": "-0.1"}, "--gpu-compute-request", "[0, 1]"),
    ({"limit": "abc"}, "--gpu-compute-limit", "[0, 1]"),
    ({"request": "0.6", "limit": "0.4"}, "--gpu-compute-limit", "at least --gpu-compute-request"),
    ({"mode": "fast"}, "--gpu-compute-mode", "off, fair, strict"),
    ({"request": "0.3", "limit": "0.5", "mode": "strict"}, "--gpu-compute-limit", "strict"),
])
def test_bad_input_names_the_flag_and_rule(kw: dict[str, str], field: str, rule: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        compute.resolve(HALF, cluster_mode="fair", names=compute.CLI, **kw)
    assert e.value.field == field and rule in str(e.value)


def test_compute_request_above_the_portion_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="may not exceed the GPU portion"):
        compute.resolve(GpuRequest.fraction("0.2"), request="0.6", cluster_mode="fair", names=compute.CLI)
    assert compute.resolve(GpuRequest.fraction("0.2"), request="0.1", cluster_mode="fair") is not None


def test_compute_request_on_whole_gpu_or_mig_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="whole GPUs"):
        compute.resolve(GpuRequest.whole(1), request="0.5", cluster_mode="fair")
    with pytest.raises(InvalidRequest, match="MIG partition"):
        compute.resolve(HALF, request="0.5", cluster_mode="fair", mig=True)


def test_compute_request_while_cluster_mode_off_is_refused() -> None:
    with pytest.raises(InvalidRequest) as e:
        compute.resolve(HALF, request="0.3", cluster_mode="off", names=compute.ANNOTATIONS)
    assert e.value.field == "tessera.io/gpu-compute-request" and "off in this cluster" in str(e.value)


def test_counting_and_placement() -> None:
    s = compute.ComputeShare(Decimal("0.7"), Decimal(1), "fair")
    assert compute.counted_portion(MEM, s, 0.1) == 0.7  # max(memory portion, compute request)
    assert compute.counted_portion(MEM, compute.ComputeShare(Decimal("0.1"), Decimal(1), "fair"), 0.5) == 0.5
    assert compute.fits([Decimal("0.3")], s)
    assert not compute.fits([Decimal("0.4")], s)


def test_webhook_translations() -> None:
    assert compute.from_gpucores("30") == (Decimal("0.3"), Decimal("0.3"))
    with pytest.raises(InvalidRequest, match="0 to 100"):
        compute.from_gpucores("130")
    assert compute.from_kai_mode("time-slicing", "x") == "fair"
    with pytest.raises(InvalidRequest, match="sm-sharing"):
        compute.from_kai_mode("sm-sharing", "x")

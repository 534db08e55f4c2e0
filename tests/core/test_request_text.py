"""The one request text every view prints (tessera.core.request_text)."""

from __future__ import annotations

import pytest

from tessera.core.model import GpuRequest
from tessera.core.request_text import devices_text, mig_placement_text, request_text
from tessera.core.requests import parse_gpu_request
from tessera.core.units import memory_text


@pytest.mark.parametrize(("typed", "text"), [
    ("5G", "5G (4.66 GiB)"),
    ("70GB", "70G (65.2 GiB)"),
    ("500M", "500M (477 MiB)"),
    ("2Gi", "2 GiB"),
    ("2GiB", "2 GiB"),
    ("5000Mi", "5000 MiB (4.88 GiB)"),
    ("1536Mi", "1536 MiB (1.5 GiB)"),
    ("1Ti", "1 TiB"),
    ("1T", "1T (931 GiB)"),
])
def test_memory_reads_as_typed_next_to_binary(typed: str, text: str) -> None:
    request = parse_gpu_request(gpu_memory=typed, memory_unit_required=True)
    assert request.memory is not None
    assert memory_text(request.memory) == text


@pytest.mark.parametrize(("fields", "workers", "text"), [
    ({"gpu": "0.5"}, 1, "0.5 GPU"),
    ({"gpu": "0.5000"}, 1, "0.5 GPU"),
    ({"gpu_portion": "0.025"}, 1, "0.025 GPU"),
    ({"gpu_portion": "0.25", "gpu_portion_limit": "0.8"}, 1, "0.25 GPU, bursting to 0.8"),
    ({"gpu_portion": "0.25", "gpu_portion_limit": "1"}, 1, "0.25 GPU, bursting to 1"),
    ({"gpu_portion": "0.25", "gpu_portion_limit": "0.25"}, 1, "0.25 GPU"),
    ({"gpu": "0.1"}, 3, "3 × 0.1 GPU"),
    ({"gpu_devices": "2", "gpu_portion": "0.25", "gpu_portion_limit": "0.5"}, 1,
     "0.25 GPU on each of 2 GPUs, bursting to 0.5"),
    ({"gpu_memory": "5G"}, 1, "5G (4.66 GiB) of GPU memory"),
    ({"gpu_memory": "2G", "gpu_memory_limit": "8G"}, 1,
     "2G (1.86 GiB) of GPU memory, bursting to 8G (7.45 GiB)"),
    ({"gpu_devices": "4", "gpu_memory": "2Gi"}, 1, "2 GiB of GPU memory on each of 4 GPUs"),
    ({"gpu": "2"}, 1, "2 whole GPUs"),
    ({"gpu": "1"}, 2, "2 × 1 whole GPU"),
    ({"gpu": "0.5", "gpu_model": "V100M16"}, 1, "0.5 GPU of model V100M16"),
    ({}, 1, "no GPU"),
])
def test_request_text(fields: dict[str, str], workers: int, text: str) -> None:
    gpu = parse_gpu_request(**fields, memory_unit_required=True)  # type: ignore[arg-type]
    assert request_text(gpu, workers) == text


def test_mig_request_and_placement() -> None:
    assert request_text(GpuRequest.none(), 1, "3g.20gb") == "MIG 3g.20gb"
    assert request_text(GpuRequest.none(), 2, "1g.5gb") == "2 × MIG 1g.5gb"
    assert mig_placement_text({"profile": "3g.20gb", "gpuIndex": 0, "start": 0}) == \
        "MIG 3g.20gb on GPU 0, slot 0"
    assert mig_placement_text({"profile": "1g.5gb", "gpuIndex": 2, "start": 6}) == \
        "MIG 1g.5gb on GPU 2, slot 6"
    assert mig_placement_text(None) == ""


def test_devices_text() -> None:
    assert devices_text([{"index": 0, "requestBytes": 8 * 2**30, "limitBytes": 8 * 2**30}],
                        False) == "GPU 0 8 GiB"
    assert devices_text([{"index": 1, "requestBytes": 4 * 2**30, "limitBytes": 12 * 2**30}],
                        False) == "GPU 1 4 GiB (limit 12 GiB)"
    assert devices_text([{"index": 2, "requestBytes": 0, "limitBytes": 0},
                         {"index": 3, "requestBytes": 0, "limitBytes": 0}], True) == \
        "GPU 2 whole, GPU 3 whole"
    assert devices_text([], False) == ""


def test_mig_placement_by_uuid() -> None:
    assert mig_placement_text({"profile": "3g.20gb", "gpuIndex": "GPU-m", "start": 4}) == \
        "MIG 3g.20gb on GPU-m, slot 4"

"""The CLI's spec.compute (tessera.api.compute_fields.submission_compute) reads back, through
the API's own model, as the request the CLI parsed; the document view (compute_doc) says the
same request."""

from __future__ import annotations

import pytest

from tessera.api.compute_fields import compute_doc, submission_compute
from tessera.api.models import Compute
from tessera.core.model import GpuKind
from tessera.core.requests import parse_gpu_request


@pytest.mark.parametrize("flags", [
    {"gpu": "1"}, {"gpu": "2"}, {"gpu": "0.25"}, {"gpu_portion": "0.5", "gpu_portion_limit": "0.8"},
    {"gpu_memory": "5G"}, {"gpu_memory": "4Gi", "gpu_memory_limit": "6Gi"},
    {"gpu_devices": "2", "gpu_portion": "0.1"}, {"gpu_memory": "2500M", "gpu_devices": "3"},
])
def test_what_the_cli_sends_reads_back_as_what_it_parsed(flags: dict[str, str]) -> None:
    req = parse_gpu_request(**flags, memory_unit_required=True)  # type: ignore[arg-type]
    body = submission_compute(req, flags.get("gpu_memory"), flags.get("gpu_memory_limit"))
    assert Compute.model_validate(body).gpu == req
    view = compute_doc(req)
    assert view["gpuDevicesRequest"] == (req.devices or None)
    assert view.get("gpuRequestType") == (None if req.kind is GpuKind.WHOLE else req.kind.value)

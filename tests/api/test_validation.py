"""The checks both backends share (tessera.api.validation), tested once here; the backends'
own tests show they call them (tests/api for embedded mode, tests/kube/api/test_kube_cli.py)."""

from __future__ import annotations

import pytest

from tessera.api.backend import ProjectFields, WorkloadSubmission
from tessera.api.validation import (
    check_limit,
    check_mig_limit,
    check_mig_profile,
    check_project,
    check_submission,
)
from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuDevice, GpuRequest, Node
from tessera.core.units import GiB

NODE = Node("n", tuple(GpuDevice(f"GPU-{i}", i, 16 * GiB, "V100-16GB") for i in range(2)))


def sub(**kw: object) -> WorkloadSubmission:
    base: dict[str, object] = {"name": "job", "project": "a", "type": "Training",
                               "gpu": GpuRequest.whole(1), "command": ["true"]}
    base.update(kw)
    return WorkloadSubmission(**base)  # type: ignore[arg-type]


def refusal(fn: object, *args: object) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        fn(*args)  # type: ignore[operator]
    return info.value


def test_a_valid_submission_resolves_its_class_and_gang() -> None:
    a = check_submission(sub(type="Workspace", workers=3))
    assert (a.priority_class, a.priority, a.preemptible, a.min_workers) == ("build", 100, False, 3)
    assert check_submission(sub(workers=2)).min_workers == 2
    assert check_submission(sub(priority_class="build-preemptible")).preemptible


@pytest.mark.parametrize(("kw", "field", "rule"), [
    ({"name": "Bad_Name"}, "name", "lowercase"),
    ({"name": "a" * 64}, "name", "at most 63"),
    ({"command": [], "image": ""}, "spec.command", "is required"),
    ({"workers": 0}, "spec.workers", "1 or more"),
    ({"workers": 2, "min_workers": 3}, "spec.minWorkers", "1 to workers (2)"),
    ({"type": "Workspace", "workers": 3, "min_workers": 2}, "spec.minWorkers", "a workspace cannot resize"),
    ({"type": "Inference", "workers": 3, "min_workers": 1}, "spec.minWorkers", "an inference cannot resize"),
    ({"priority_class": "urgent"}, "spec.priorityClass", "must be one of train"),
])
def test_a_bad_submission_names_the_field_and_the_rule(kw: dict[str, object], field: str,
                                                       rule: str) -> None:
    exc = refusal(check_submission, sub(**kw))
    assert exc.field == field and rule in str(exc)


@pytest.mark.parametrize(("fields", "field"), [
    (ProjectFields("Team A"), "name"),
    (ProjectFields("a", deserved=-1), "resources.gpu.deserved"),
    (ProjectFields("a", deserved=2, limit=1), "resources.gpu.limit"),
    (ProjectFields("a", over_quota_weight=-0.5), "resources.gpu.overQuotaWeight"),
])
def test_bad_project_fields_name_the_field(fields: ProjectFields, field: str) -> None:
    assert refusal(check_project, fields).field == field


def test_the_limit_counts_what_the_request_would_use() -> None:
    assert check_limit(GpuRequest.fraction("0.5"), [NODE], 2, "a", 1.0) == 1.0
    assert check_limit(GpuRequest.whole(2), [NODE], 1, "a", None) == 2.0
    exc = refusal(check_limit, GpuRequest.of_memory(8 * GiB), [NODE], 3, "a", 1.0)
    assert exc.field == "spec.compute" and "asks 1.5 GPUs, more than project a's limit of 1" in str(exc)


@pytest.mark.parametrize(("compute", "gpu", "mode", "field", "rule"), [
    (("0.3", None, None), GpuRequest.fraction("0.5"), "off", "spec.compute.gpuComputeRequest", "off in this cluster"),
    (("1.2", None, None), GpuRequest.fraction("0.5"), "fair", "spec.compute.gpuComputeRequest", "[0, 1]"),
    (("0.6", "0.4", None), GpuRequest.fraction("0.5"), "fair", "spec.compute.gpuComputeLimit", "at least"),
    ((None, None, "turbo"), GpuRequest.fraction("0.5"), "fair", "spec.compute.gpuComputeMode", "off, fair, strict"),
    (("0.5", None, None), GpuRequest.whole(1), "fair", "spec.compute.gpuComputeRequest", "whole GPUs"),
])
def test_compute_share_refusals_name_the_field(monkeypatch: pytest.MonkeyPatch, compute: tuple[object, ...],
                                               gpu: GpuRequest, mode: str, field: str, rule: str) -> None:
    monkeypatch.setenv("TESSERA_GPU_COMPUTE_MODE", mode)
    e = refusal(check_submission, sub(gpu=gpu, compute=compute))
    assert e.field == field and rule in e.rule


def test_compute_share_defaults_from_the_cluster_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_GPU_COMPUTE_MODE", "strict")
    share = check_submission(sub(gpu=GpuRequest.fraction("0.25"))).compute
    assert share is not None and (str(share.request), str(share.limit), share.mode) == ("0.25", "0.25", "strict")
    monkeypatch.setenv("TESSERA_GPU_COMPUTE_MODE", "off")
    assert check_submission(sub(gpu=GpuRequest.fraction("0.25"))).compute is None
    assert check_submission(sub(gpu=GpuRequest.fraction("0.25"), mig_profile=None)).compute is None


# ---- MIG submissions: one rule set, one wording, for both backends -----------------------------
def test_mig_profile_checks_name_the_field_and_what_exists() -> None:
    assert check_mig_profile("3g.20gb", {"A100-40GB"}, "on this cluster", 2) \
        == pytest.approx(3 / 7, abs=1e-3)
    with pytest.raises(InvalidRequest) as e:
        check_mig_profile("1g.5gb", set(), "on this machine", 1)
    assert str(e.value).startswith("spec.compute.gpuMigProfile: no GPU in MIG mode on this "
                                   "machine (MIG mode is an operator's choice")
    with pytest.raises(InvalidRequest) as e:
        check_mig_profile("3g.40gb", {"A100-40GB"}, "on this cluster", 1)
    assert str(e.value).startswith("spec.compute.gpuMigProfile: no GPU in MIG mode on this "
                                   "cluster has this profile (MIG profiles here: A100-40GB: ")
    with pytest.raises(InvalidRequest) as e:
        check_mig_profile("1g.5gb", {"A100-40GB"}, "on this machine", 2, max_workers=1)
    assert e.value.field == "spec.workers"


def test_mig_limit_counts_every_worker_s_partition() -> None:
    assert check_mig_limit(0.25, 2, "p", 0.5) == 0.5
    assert check_mig_limit(0.25, 2, "p", None) == 0.5
    with pytest.raises(InvalidRequest) as e:
        check_mig_limit(3 / 7, 2, "p", 0.5, value="3g.20gb")
    assert str(e.value) == ("spec.compute.gpuMigProfile: counts as 0.857 GPU (2 x 0.429), more "
                            "than project p's limit 0.5 (got '3g.20gb')")
    with pytest.raises(InvalidRequest) as e:
        check_mig_limit(4 / 7, 1, "small", 0.5)
    assert "counts as 0.571 GPU, more than project small's limit 0.5" in str(e.value)

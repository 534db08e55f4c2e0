"""The checks every backend makes on a submission and on project fields, before it looks at
its own state: one module, so embedded mode and Kubernetes refuse the same input with the same
words (the field as the API names it, and the rule).

What only one backend can check stays there: the container runtime and published ports on this
machine (embedded), the project's namespace and the annotations' round trip (Kubernetes), and
names already taken (a 409 from either).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from tessera.api.backend import ProjectFields, WorkloadSubmission
from tessera.core import compute as compute_rules
from tessera.core.errors import InvalidRequest
from tessera.core.mig import fraction_on, supported_text
from tessera.core.model import GpuRequest, Node
from tessera.core.requests import estimate_gpus
from tessera.core.text import (
    MAX_IMAGE,
    MAX_NAME,
    MAX_PATH,
    MAX_SHORT,
    check_argv,
    check_env,
    check_text,
    shown,
)
from tessera.core.units import format_gpus
from tessera.core.workloads import PRIORITY_CLASSES

NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
"""A DNS label; always used with ``fullmatch`` (``$`` would let a trailing newline through)."""
NAME_RULE = ("must be lowercase letters, digits and '-', start and end alphanumeric, "
             "at most 63 characters")
DEFAULT_CLASS = {"Training": "train", "Workspace": "build", "Inference": "inference"}
"""The priority class a workload type gets when the submission names none."""


def check_name(name: str, field: str = "name") -> None:
    """A project or workload name: a DNS label (it becomes a namespace or an object name)."""
    if not isinstance(name, str) or len(name) > MAX_NAME or not NAME.fullmatch(name):
        raise InvalidRequest(field, NAME_RULE, shown(str(name)))


def check_project(f: ProjectFields) -> None:
    check_name(f.name)
    if f.deserved < 0:
        raise InvalidRequest("resources.gpu.deserved", "must be 0 or more", f.deserved)
    if f.limit is not None and f.limit < f.deserved:
        raise InvalidRequest("resources.gpu.limit", f"must be at least deserved ({f.deserved:g})",
                             f.limit)
    if f.over_quota_weight < 0:
        raise InvalidRequest("resources.gpu.overQuotaWeight", "must be 0 or more")


@dataclass(frozen=True, slots=True)
class Admitted:
    """What a valid submission resolves to."""

    priority_class: str
    priority: int
    preemptible: bool
    min_workers: int
    compute: compute_rules.ComputeShare | None = None
    """The compute share its kernels are gated by (None: not gated)."""


def check_submission(s: WorkloadSubmission) -> Admitted:
    """The checks that need nothing but the submission. Every text field is checked here too
    (``tessera.core.text``), whatever front end built the submission, so a value no process
    can receive is refused before it is stored."""
    check_name(s.name)
    check_text(s.project, "projectId", MAX_SHORT)
    for key in s.spec:
        if str(key).startswith("_"):  # the backends' own state, never the user's to set
            raise InvalidRequest(f"spec.{key}", "is not a field of a workload's spec (names "
                                 "starting with '_' are reserved for tessera's own state)")
    check_argv(list(s.command), "spec.command")
    check_env(dict(s.env), "spec.environmentVariables")
    check_text(s.image, "spec.image", MAX_IMAGE)
    if s.working_dir is not None:
        check_text(s.working_dir, "spec.workingDir", MAX_PATH)
    if not s.command and not s.image:
        raise InvalidRequest("spec.command", "is required: the command to run (or an image, "
                             "whose entrypoint runs)")
    if s.workers < 1:
        raise InvalidRequest("spec.workers", "must be 1 or more", s.workers)
    min_workers = s.workers if s.min_workers is None else s.min_workers
    if not 1 <= min_workers <= s.workers:
        raise InvalidRequest("spec.minWorkers", f"must be 1 to workers ({s.workers})", min_workers)
    if min_workers < s.workers and s.type != "Training":
        kind = s.type.lower()
        raise InvalidRequest("spec.minWorkers", "elastic (below workers) only for trainings: "
                             f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} cannot resize, so all "
                             f"{s.workers} workers start together", min_workers)
    pclass = s.priority_class or DEFAULT_CLASS[s.type]
    known = PRIORITY_CLASSES.get(pclass)
    if known is None:
        raise InvalidRequest("spec.priorityClass", f"must be one of {', '.join(PRIORITY_CLASSES)}",
                             pclass)
    share = check_compute(s)
    return Admitted(pclass, known.value, known.preemptible, min_workers, share)


def cluster_compute_mode() -> str:
    """The cluster's default compute-share mode: ``tessera up --gpu-compute-mode`` / the Helm
    value ``compute.mode`` set TESSERA_GPU_COMPUTE_MODE (default off)."""
    import os

    return os.environ.get("TESSERA_GPU_COMPUTE_MODE", "off").strip().lower() or "off"


def check_compute(s: WorkloadSubmission, cluster_mode: str | None = None) -> compute_rules.ComputeShare | None:
    """spec.compute.gpuComputeRequest|Limit|Mode against the GPU request and the cluster's mode
    (tessera.core.compute: the rules every front end shares)."""
    request, limit, mode = s.compute
    return compute_rules.resolve(s.gpu, request=request, limit=limit, mode=mode,
                                 cluster_mode=cluster_mode or cluster_compute_mode(),
                                 mig=s.mig_profile is not None, names=compute_rules.API)


def check_limit(gpu: GpuRequest, nodes: Iterable[Node], workers: int, project: str,
                limit: float | None, compute: compute_rules.ComputeShare | None = None) -> float:
    """The request against the project's hard limit; returns the GPUs it counts as
    (``estimate_gpus``; with its compute share, max(memory portion, compute request) per
    device, as quota counts it). Whether any GPU could ever hold it is
    ``check_against_cluster``, which backends call first."""
    estimate = estimate_gpus(compute_rules.on_request(gpu, compute), nodes, workers)
    if limit is not None and estimate > limit + 1e-9:
        raise InvalidRequest(
            "spec.compute",
            f"asks {format_gpus(estimate)} GPUs, more than project {project}'s limit of {limit:g}",
        )
    return estimate


MIG_FIELD = "spec.compute.gpuMigProfile"
NO_MIG = ("(MIG mode is an operator's choice, set with nvidia-smi -mig 1; tessera never "
          "switches it)")


def check_mig_profile(profile: str, models: Iterable[str], where: str, workers: int,
                      max_workers: int | None = None) -> float:
    """A MIG submission against the models of the GPUs in MIG mode ``where`` ("on this
    machine", "on this cluster"): the GPU fraction one partition of ``profile`` counts as; else
    the refusal, in the same words on both backends. ``max_workers``: the most pods a MIG
    workload may have on this backend (embedded mode serves one partition per workload)."""
    if max_workers is not None and workers > max_workers:
        raise InvalidRequest("spec.workers", f"must be at most {max_workers} with "
                             f"gpuMigProfile {where} (one partition, one pod)", workers)
    models = set(models)
    if not models:
        raise InvalidRequest(MIG_FIELD, f"no GPU in MIG mode {where} {NO_MIG}", profile)
    fraction = fraction_on(models, profile)
    if fraction is None:
        raise InvalidRequest(MIG_FIELD, f"no GPU in MIG mode {where} has this profile (MIG "
                             f"profiles here: {supported_text(models)})", profile)
    return fraction


def check_mig_limit(fraction: float, workers: int, project: str, limit: float | None,
                    field: str = MIG_FIELD, value: object = None) -> float:
    """MIG partitions (``workers`` of ``fraction`` each) against the project's hard limit;
    returns the GPUs they count as."""
    counts = fraction * workers
    if limit is not None and counts > limit + 1e-9:
        each = f" ({workers} x {fraction:.3g})" if workers != 1 else ""
        raise InvalidRequest(field, f"counts as {counts:.3g} GPU{each}, more than project "
                             f"{project}'s limit {limit:g}", value)
    return counts

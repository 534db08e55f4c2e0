"""What the Kubernetes API backend does not make yet, refused by name rather than half-applied
(docs/workloads.md)."""

from __future__ import annotations

from tessera.api.backend import WorkloadSubmission
from tessera.core.errors import InvalidRequest


def refuse_unsupported(s: WorkloadSubmission) -> None:
    if s.spec.get("ports"):
        raise InvalidRequest("spec.ports", "is not supported on the Kubernetes backend yet "
                             "(no Service is created); expose the pod with a Service")
    if s.spec.get("completions") is not None:
        raise InvalidRequest("spec.completions", "a sweep is not made by the Kubernetes "
                             "backend yet: apply an Indexed Job (its trials are grouped, the "
                             "Job controller runs parallelism and retries)")

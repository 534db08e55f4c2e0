"""What the Kubernetes API backend does not make yet, refused by name rather than half-applied
(docs/workloads.md)."""

from __future__ import annotations

from tessera.api.backend import WorkloadSubmission
from tessera.core.errors import InvalidRequest


def refuse_unsupported(s: WorkloadSubmission) -> None:
    if s.spec.get("autoscaling"):
        raise InvalidRequest("spec.autoscaling", "is not supported on the Kubernetes backend yet "
                             "(no Deployment or scaler is made); apply a Deployment, a Service "
                             "and a HorizontalPodAutoscaler, whose pods tessera schedules")

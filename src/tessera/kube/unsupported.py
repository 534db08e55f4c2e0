"""What the Kubernetes API backend does not make yet, refused by name rather than half-applied
(docs/workloads.md)."""

from __future__ import annotations

from tessera.api.backend import WorkloadSubmission
from tessera.core.errors import InvalidRequest


def refuse_unsupported(s: WorkloadSubmission) -> None:
    if s.spec.get("autoscaling") and any(p.get("externalUrl")
                                         for p in s.spec.get("ports") or []):
        raise InvalidRequest("spec.ports[0].externalUrl", "is for a workspace, a training or "
                             "an inference of one pod; an inference that scales is reached at "
                             "its Service's URL")

"""The Kubernetes API's project document carries the fair share the scheduler wrote to the
Project's status, with the names the embedded API uses, and `tessera project describe` words it
the same way on both backends (tessera.api.fair_share_doc)."""

from __future__ import annotations

import threading

from lightkube.models.meta_v1 import ObjectMeta

from tessera.api.fair_share_doc import fair_share_text
from tessera.kube.cluster_projects import ClusterProjects
from tessera.kube.objects import ProjectResource


def test_the_schedulers_share_fields_reach_the_api_document() -> None:
    obj = ProjectResource(metadata=ObjectMeta(name="b", uid="u1"), spec={
        "namespace": "b", "resources": {"gpu": {"deserved": 1}}}, status={
        "allocated": {"gpu": 2}, "fairShare": {"gpu": 2.3, "cpu": 4.0},
        "fromUsageHistory": {"gpu": 0.4}, "usageGpuHours": 1.5, "observedAt": "x"})
    doc = ClusterProjects(None, threading.Lock()).doc(obj)
    assert doc["status"] == {"allocated": {"gpu": 2.0}, "fairShare": {"gpu": 2.3, "cpu": 4.0},
                             "fromUsageHistory": {"gpu": 0.4}, "usageGpuHours": 1.5}
    assert fair_share_text(doc["status"]) == "fair share 2.3 GPU, of which 0.4 from usage history"
    assert fair_share_text({"fairShare": {"gpu": 1}, "fromUsageHistory": {"gpu": -0.25}}) == \
        "fair share 1 GPU, 0.25 less due to usage history"
    assert fair_share_text({"allocated": {"gpu": 1}}) is None

"""The scheduler's informers (watch-fed caches of the API server) and their event handlers.

Each cache holds objects as parsed (tessera.kube.objects); nothing here is written by the
scheduler, except what other schedulers' pods hold per node (``foreign``), summed from their
events. A change that may let a pod be placed sets ``wake``; pod events go to ``on_pod``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightkube import AsyncClient
from lightkube.operators import not_equal
from lightkube.resources.core_v1 import ConfigMap, Namespace, Node, PersistentVolumeClaim, Pod

from tessera.kube import claims as dra
from tessera.kube import names
from tessera.kube.informer import Informer
from tessera.kube.lean_watch import LeanSource
from tessera.kube.objects import (
    ForeignPod,
    NodeInfo,
    PodGroupInfo,
    PodGroupResource,
    PodInfo,
    PodKey,
    ProjectInfo,
    ProjectResource,
    foreign_pod,
    node_info,
    pod_group_info,
    pod_info,
    project_info,
    same_for_scheduling,
)
from tessera.kube.rawapi import RawApi

PodHandler = Callable[[PodKey, PodInfo | None, PodInfo | None], None]


@dataclass(frozen=True, slots=True)
class ConfigMapInfo:
    namespace: str
    name: str
    pod: str | None


def _cm_info(obj: Any) -> ConfigMapInfo:
    meta = obj.metadata
    return ConfigMapInfo(meta.namespace, meta.name,
                         (meta.annotations or {}).get(names.CONFIGMAP_POD))


def _ns_key(o: Any) -> tuple[str, str]:
    return (o.metadata.namespace, o.metadata.name)


class ClusterCaches:
    def __init__(self, client: AsyncClient, wake: asyncio.Event, on_pod: PodHandler,
                 raw: RawApi | None = None) -> None:
        self.wake = wake
        mine = {"spec.schedulerName": names.SCHEDULER_NAME}
        self.foreign: dict[str, list[int]] = {}
        """node -> [GPUs, CPU millicores, memory] held by other schedulers' pods."""
        self.nodes: Informer[NodeInfo] = Informer(
            client, Node, lambda o: o.metadata.name, node_info, self._on_node, name="nodes")
        self.pods: Informer[PodInfo] = Informer(
            client, Pod, _ns_key, pod_info, on_pod, fields=mine, name="pods",
            same=same_for_scheduling, index=lambda p: p.node or None,
            source=None if raw is None else LeanSource(raw, "/api/v1/pods", mine))
        """Listed and watched through the lean client where there is one (kube.lean_watch)."""
        self.projects: Informer[ProjectInfo] = Informer(
            client, ProjectResource, lambda o: o.metadata.name, project_info, self._on_other,
            name="projects", same=lambda a, b: (a.project, a.namespace, a.error)
            == (b.project, b.namespace, b.error))
        self.pod_groups: Informer[PodGroupInfo] = Informer(
            client, PodGroupResource, _ns_key, pod_group_info, self._on_other,
            name="podgroups")
        self.configmaps: Informer[ConfigMapInfo] = Informer(
            client, ConfigMap, _ns_key, _cm_info, lambda *a: None,
            labels={names.MANAGED_BY: "tessera"}, name="configmaps")
        self.foreign_pods: Informer[ForeignPod | None] = Informer(
            client, Pod, _ns_key, foreign_pod, self._on_foreign,
            fields={"spec.schedulerName": not_equal(names.SCHEDULER_NAME),
                    "spec.nodeName": not_equal("")},
            name="other-pods", same=lambda a, b: a == b,
            source=None if raw is None else LeanSource(raw, "/api/v1/pods", {
                "spec.schedulerName!": names.SCHEDULER_NAME, "spec.nodeName!": ""}))
        self.namespaces: Informer[dict[str, str]] = Informer(
            client, Namespace, lambda o: o.metadata.name,
            lambda o: dict(o.metadata.labels or {}), self._on_other, name="namespaces",
            same=lambda a, b: a == b)
        self.volume_claims: Informer[str] = Informer(
            client, PersistentVolumeClaim, _ns_key,
            lambda o: (o.status.phase if o.status else None) or "Pending", self._on_other,
            name="persistentvolumeclaims", same=lambda a, b: a == b)
        """PersistentVolumeClaim phases (not ResourceClaims: ``resource_claims``)."""
        self.resource_claims: Informer[dict[str, Any]] = Informer(
            client, dra.ResourceClaim, _ns_key, lambda o: o.to_dict(), self._on_other,
            name="resourceclaims", same=lambda a, b: a == b, optional=True)
        self.informers: list[Informer[Any]] = [
            self.foreign_pods, self.nodes, self.pods, self.projects, self.pod_groups,
            self.configmaps, self.namespaces, self.volume_claims, self.resource_claims]

    def foreign_held(self) -> dict[str, tuple[int, int, int]]:
        return {n: (v[0], v[1], v[2]) for n, v in self.foreign.items()}

    def _on_node(self, key: Any, old: NodeInfo | None, new: NodeInfo | None) -> None:
        def facts(n: NodeInfo) -> tuple[Any, ...]:
            return (n.unschedulable, n.ready, n.agent_ready, n.labels, n.taints, n.resources,
                    n.mig)
        if old is None or new is None or old.node != new.node or facts(old) != facts(new):
            self.wake.set()

    def _on_foreign(self, key: Any, old: ForeignPod | None, new: ForeignPod | None) -> None:
        for f, sign in ((old, -1), (new, 1)):
            if f is not None:
                acc = self.foreign.setdefault(f.node, [0, 0, 0])
                acc[0] += sign * f.gpus
                acc[1] += sign * f.cpu_milli
                acc[2] += sign * f.memory
                if not any(acc):
                    del self.foreign[f.node]
        some = new or old
        if (old.gpus if old else 0) != (new.gpus if new else 0) or (
                some is not None and some.sched is not None):
            self.wake.set()

    def _on_other(self, key: Any, old: Any, new: Any) -> None:
        self.wake.set()

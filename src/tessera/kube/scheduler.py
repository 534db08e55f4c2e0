"""tessera's Kubernetes scheduler: watch, snapshot, run the core cycle, apply the plan.

    python -m tessera.kube.scheduler --kubeconfig PATH      (console script: tessera-scheduler)

State lives in the API server, never only here: a pod's placement is written onto it (the
``tessera.io/placement`` annotation, in the same request as the binding), a shared GPU is held
by a reservation pod whose name is derived from (node, device) so it can never be created twice,
and everything else is rebuilt from watches after a restart. What this process keeps in memory
is only what it has decided and not yet seen come back (``assumed``), so the next cycle does
not give the same room away twice. See docs/kubernetes.md.

Its own units: ``snapshot`` (caches -> the core's Snapshot), ``binder.Writer`` (API writes),
``reservations`` (reservation pods), ``reporting`` (conditions, project status, Events),
``predicates`` (kube-scheduler filters). This file (over 400 lines) is the event handlers, the
loop, applying a plan, binding and cleanup, plus the process entry point and its flags (``main``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import random
import signal
import socket
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.operators import not_equal
from lightkube.resources.core_v1 import ConfigMap, Namespace, Node, PersistentVolumeClaim, Pod

from tessera.core.cycle import CycleConfig, Plan, run_cycle
from tessera.core.errors import InvalidRequest
from tessera.core.gpu_models import GPU_MODELS
from tessera.core.mig import (
    MEMORY_MIB,
    SERVES_SHARES,
    MigChoice,
    choose,
    parse_serves_shares,
    profile_fraction,
    serving_profile,
)
from tessera.core.model import GpuKind, GpuRequest
from tessera.core.placement import DEFAULT_POLICY, POLICIES
from tessera.core.state import Placement
from tessera.core.units import portion_bytes
from tessera.kube import claims as dra
from tessera.kube import metrics, names
from tessera.kube.binder import Writer
from tessera.kube.health import start_health_server
from tessera.kube.informer import Informer
from tessera.kube.leader import LeaderElector, LostLeadership
from tessera.kube.mig import MigHold, MigView, apply_choice, blocked
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
    new_version,
    node_info,
    pod_group_info,
    pod_info,
    project_info,
    same_for_scheduling,
)
from tessera.kube.predicates.selectors import NodeSelectorTerm, Requirement
from tessera.kube.predicates.spec import SchedulingSpec
from tessera.kube.rawapi import RawApi
from tessera.kube.reporting import Reporter
from tessera.kube.reservations import Reservations
from tessera.kube.retry import is_transient, status_code
from tessera.kube.snapshot import (
    Context,
    SnapshotBuilder,
    agents_not_ready_text,
    find_conflicts,
)

log = logging.getLogger("tessera.kube")

ACTIONS = ("allocate", "consolidate", "reclaim", "preempt", "backfill")
"""Consolidation moves a pod by evicting it (Eviction API, so PodDisruptionBudgets hold) when
its controller recreates it (ReplicaSet, StatefulSet, Job); bare pods are never moved."""

UNMOVABLE_SECONDS = 300.0
"""How long a pod whose eviction was refused (a PodDisruptionBudget) is not moved again."""


@dataclass(frozen=True)
class Options:
    system_namespace: str = names.SYSTEM_NAMESPACE
    concurrency: int = 32
    debounce: float = 0.05
    period: float = 5.0
    uuid_timeout: float = 120.0
    reservation_image: str = "registry.k8s.io/pause:3.10"
    policy: str | None = None
    reclaim: bool = True
    """Run the reclaim action (GPUs lent over quota given back to a project below its share)."""
    min_runtime: float = 0.0
    """Seconds a pod runs before reclaim or preemption may evict it, unless its project (the
    Project's reclaimMinRuntimeSeconds / preemptMinRuntimeSeconds) says otherwise."""

    def cycle_config(self, evicting: bool) -> CycleConfig:
        """The core's configuration for one cycle; while evictions are in flight, only allocate
        and backfill (nothing is evicted twice)."""
        actions: tuple[str, ...] = ACTIONS if not evicting else ("allocate", "backfill")
        if not self.reclaim:
            actions = tuple(a for a in actions if a != "reclaim")
        kwargs: dict[str, Any] = {} if self.policy is None else {"policy": self.policy}
        return CycleConfig(actions=actions, preempt_min_runtime=self.min_runtime,
                           reclaim_min_runtime=self.min_runtime, **kwargs)


@dataclass(frozen=True, slots=True)
class ConfigMapInfo:
    namespace: str
    name: str
    pod: str | None


CLAIM_GRACE_SECONDS = 5.0
"""How long a new pod's missing ResourceClaim is taken for one whose watch event has not arrived
yet (created just before the pod) before the pod is told it is missing."""


def _on_node(pod: PodInfo, node: str) -> SchedulingSpec:
    """The pod's scheduling spec held to ``node`` as well (required node affinity on
    metadata.name, ANDed into each of its terms)."""
    base = pod.base_sched or SchedulingSpec(pod.namespace, tuple(sorted(pod.labels.items())))
    req = Requirement("metadata.name", "In", (node,))
    terms = base.required_terms if base.required_terms is not None else (NodeSelectorTerm(),)
    return dataclasses.replace(base, required_terms=tuple(
        dataclasses.replace(t, fields=(*t.fields, req)) for t in terms))


def _held_bytes(held: Placement, gpu: GpuRequest, node: Any) -> tuple[int, ...]:
    """What the core would hold on each device of a claim's allocation (as its first pod's
    placement had it): the schedulable memory of whole GPUs, a portion of it, or the memory
    asked."""
    out = []
    for d, consumed in zip(held.devices, held.request_bytes, strict=True):
        dev = node.gpus[d]
        if held.exclusive:
            out.append(dev.schedulable)
        elif gpu.portion is not None:
            out.append(portion_bytes(gpu.portion, dev.schedulable))
        else:
            out.append(min(consumed, dev.schedulable))
    return tuple(out)


SERVABLE_WAITS = ("placement", "unschedulable", "fair-share")
"""The cycle's waits a MIG partition may end (no room on the shared GPUs, over its fair share
too: a free partition is idle room); not a wait for a limit or quota (docs/mig.md)."""


def _servable(pod: PodInfo) -> bool:
    """A pending share a partition could serve: one device, its own pod (no PodGroup), no
    ResourceClaim, no MIG profile of its own."""
    return (pod.request is not None and pod.request.gpu.shared and pod.request.gpu.devices == 1
            and pod.group is None and not pod.claim_names and pod.mig_profile is None
            and pod.reservation is None)


def _cm_info(obj: Any) -> ConfigMapInfo:
    meta = obj.metadata
    return ConfigMapInfo(meta.namespace, meta.name, (meta.annotations or {}).get(names.CONFIGMAP_POD))


class KubeScheduler:
    def __init__(self, client: AsyncClient, options: Options | None = None,
                 raw: RawApi | None = None) -> None:
        self.client = client
        self.opts = options or Options()
        self.writer = Writer(client, concurrency=self.opts.concurrency,
                             system_namespace=self.opts.system_namespace,
                             reservation_image=self.opts.reservation_image, raw=raw)
        self.wake = asyncio.Event()
        self.assumed: dict[PodKey, Placement] = {}
        self.evicting: set[PodKey] = set()
        self.unmovable: dict[PodKey, float] = {}
        """Pods consolidation must not move before the given time (their eviction was refused)."""
        self.bind_failures: dict[PodKey, tuple[str, int, float]] = {}
        """Pods whose binding failed: (the error, failures in a row, no retry before).
        A binding refused for a wiring reason (webhook, RBAC) would otherwise be retried and
        reported every cycle."""
        self.tasks: dict[PodKey, asyncio.Task[None]] = {}
        self.claims_unseen: set[PodKey] = set()
        """Pending pods whose claim this scheduler has not seen yet, created moments ago (the
        claim's watch event is on its way): they wait without a condition or Event."""
        self.mig_assumed: dict[PodKey, tuple[str, MigHold]] = {}
        """MIG pods being bound: (node, the partition chosen), held until the pod is seen bound
        with it (tessera.kube.mig)."""
        self.mig_view = MigView()
        self.mig_serving: dict[PodKey, GpuRequest] = {}
        """Pending shares that waited for room on the shared GPUs, with their request: served
        by the smallest MIG profile that holds them where a node allows it (docs/mig.md)."""
        self.serving_errors: dict[str, str] = {}
        """node -> the bad value of its label tessera.io/mig-serves-shares already logged."""
        self.releasing: set[PodKey] = set()
        """ResourceClaims being deallocated (tessera.kube.claims.released)."""
        self.background: set[asyncio.Task[Any]] = set()
        self.reservations = Reservations(self.writer, self.opts.uuid_timeout)
        self.report = Reporter(self.writer, self._spawn, self.wake)
        """Pod conditions, project status and Events, written when they change."""
        self.cycles = 0
        self.snapshots = SnapshotBuilder()
        self.conflicts: list[PodInfo] = []
        self.last_cycle_seconds = 0.0
        self.bound = 0
        self.nodes: Informer[NodeInfo] = Informer(
            client, Node, lambda o: o.metadata.name, node_info, self._on_node, name="nodes")
        self.pods: Informer[PodInfo] = Informer(
            client, Pod, lambda o: (o.metadata.namespace, o.metadata.name), pod_info,
            self._on_pod, fields={"spec.schedulerName": names.SCHEDULER_NAME}, name="pods",
            same=same_for_scheduling)
        self.projects: Informer[ProjectInfo] = Informer(
            client, ProjectResource, lambda o: o.metadata.name, project_info, self._on_other,
            name="projects", same=lambda a, b: (a.project, a.namespace, a.error)
            == (b.project, b.namespace, b.error))
        self.pod_groups: Informer[PodGroupInfo] = Informer(
            client, PodGroupResource, lambda o: (o.metadata.namespace, o.metadata.name),
            pod_group_info, self._on_other, name="podgroups")
        self.configmaps: Informer[ConfigMapInfo] = Informer(
            client, ConfigMap, lambda o: (o.metadata.namespace, o.metadata.name), _cm_info,
            lambda *a: None, labels={names.MANAGED_BY: "tessera"}, name="configmaps")
        self.configmaps_checking: set[tuple[str, str]] = set()
        """ConfigMaps whose pod the API server is being asked about before they are deleted."""
        self.foreign: dict[str, list[int]] = {}
        """node -> [GPUs, CPU millicores, memory] held by other schedulers' pods."""
        self.foreign_pods: Informer[ForeignPod | None] = Informer(
            client, Pod, lambda o: (o.metadata.namespace, o.metadata.name), foreign_pod,
            self._on_foreign, fields={"spec.schedulerName": not_equal(names.SCHEDULER_NAME),
                                      "spec.nodeName": not_equal("")},
            name="other-pods", same=lambda a, b: a == b)
        self.namespaces: Informer[dict[str, str]] = Informer(
            client, Namespace, lambda o: o.metadata.name, lambda o: dict(o.metadata.labels or {}),
            self._on_other, name="namespaces", same=lambda a, b: a == b)
        self.claims: Informer[str] = Informer(
            client, PersistentVolumeClaim, lambda o: (o.metadata.namespace, o.metadata.name),
            lambda o: (o.status.phase if o.status else None) or "Pending", self._on_other,
            name="persistentvolumeclaims", same=lambda a, b: a == b)
        self.resource_claims: Informer[dict[str, Any]] = Informer(
            client, dra.ResourceClaim, lambda o: (o.metadata.namespace, o.metadata.name),
            lambda o: o.to_dict(), self._on_other, name="resourceclaims",
            same=lambda a, b: a == b, optional=True)
        self.informers: list[Informer[Any]] = [self.foreign_pods, self.nodes, self.pods, self.projects, self.pod_groups, self.configmaps, self.namespaces, self.claims, self.resource_claims]

    # ---- cache events --------------------------------------------------------------------
    def _on_node(self, key: Any, old: NodeInfo | None, new: NodeInfo | None) -> None:
        if (old is None or new is None or old.node != new.node
                or (old.unschedulable, old.ready, old.agent_ready, old.labels, old.taints, old.resources,
                    old.mig)
                != (new.unschedulable, new.ready, new.agent_ready, new.labels, new.taints, new.resources,
                    new.mig)):
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

    def _on_pod(self, key: PodKey, old: PodInfo | None, new: PodInfo | None) -> None:
        info = new or old
        assert info is not None
        if info.reservation is not None:
            if self.reservations.seen(old, new):
                self.wake.set()
            return
        if new is None:
            self.assumed.pop(key, None)
            self.mig_assumed.pop(key, None)
            self.mig_serving.pop(key, None)
            self.evicting.discard(key)
            self.bind_failures.pop(key, None)
            self.report.forget(key)
            self.wake.set()
            return
        if new.node and key in self.assumed and (old is None or not old.node):
            del self.assumed[key]
            if not new.claim_names:  # a MIG claim's choice is kept until its claim shows it
                self.mig_assumed.pop(key, None)
            return
        if (old is None or old.node != new.node or old.deleting != new.deleting
                or old.finished != new.finished or old.annotations != new.annotations):
            self.wake.set()

    # ---- the loop ------------------------------------------------------------------------------
    async def ensure_system_namespace(self, forbidden_for: float = 60.0) -> None:
        """The first request: waits (jittered backoff up to 5 s) while the API server cannot
        be reached or answers 5xx, so a scheduler started during a control-plane outage waits
        for it instead of exiting into a crash loop's growing back-off. A 403 is retried for
        ``forbidden_for`` seconds (an API server that has just started refuses requests until
        its RBAC caches are filled), then raised: missing rules are not waited for forever."""
        forbidden_until: float | None = None
        delay = 0.2
        while True:
            try:
                try:
                    await self.client.get(Namespace, self.opts.system_namespace)
                except ApiError as exc:
                    if exc.status.code != 404:
                        raise
                    with contextlib.suppress(ApiError):  # the release namespace exists
                        await self.client.create(
                            Namespace(metadata=ObjectMeta(name=self.opts.system_namespace)))
                return
            except Exception as exc:
                if status_code(exc) == 403:
                    forbidden_until = forbidden_until or time.monotonic() + forbidden_for
                    if time.monotonic() > forbidden_until:
                        raise
                elif not is_transient(exc):
                    raise
                log.warning("waiting for the API server: %s; retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(5.0, delay * 2)

    async def run(self) -> None:
        await self.ensure_system_namespace()
        watchers = [asyncio.create_task(i.run(), name=f"watch-{i.name}") for i in self.informers]
        try:
            await asyncio.gather(*(i.synced.wait() for i in self.informers))
            log.info("caches synced: %d nodes, %d pods, %d projects", len(self.nodes.items),
                     len(self.pods.items), len(self.projects.items))
            await self.cleanup()
            last_gc = time.monotonic()
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), self.opts.period)
                # Let events gather: the busier the cycles, the more each one should take in.
                await asyncio.sleep(max(self.opts.debounce, min(1.0, 2 * self.last_cycle_seconds)))
                self.wake.clear()
                await self.cycle()
                if time.monotonic() - last_gc > 2.0:
                    await self.cleanup()
                    last_gc = time.monotonic()
                    if self.tasks:
                        log.info("in flight: %d bindings (%d waiting for a GPU UUID), %d bound "
                                 "so far, %d API writes", len(self.tasks),
                                 self.reservations.waiting(), self.bound,
                                 self.writer.calls)
        finally:
            for t in watchers:
                t.cancel()
            for t in list(self.tasks.values()) + list(self.background):
                t.cancel()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def _apply_claims(self) -> None:
        """Pods naming ResourceClaims get the request their claims make (tessera.kube.claims),
        or the reason they wait; recomputed each cycle, as claims come and change.

        A claim is allocated once, for the first pod that uses it; a pending pod whose claim is
        allocated and reserved for other live pods joins it: it asks for no GPU and is held to
        the allocation's node. Of the bound pods sharing a claim, the first live one in its
        ``reservedFor`` is charged the claim's GPUs, the others nothing, so quota, fair share
        and placement count a shared claim once for as long as any of its pods lives."""
        quiet: set[PodKey] = set()
        self.claims_unseen = quiet
        claim_pods = [p for p in self.pods.items.values()
                      if p.claim_names and p.reservation is None and not p.finished]
        if not claim_pods:
            return
        live = {p.uid for p in self.pods.items.values() if not p.finished}
        wanted = {(p.namespace, n) for p in claim_pods if not p.node for n in p.claim_names}
        claimant: dict[PodKey, str] = {}
        for p in sorted((p for p in claim_pods
                         if any((p.namespace, n) in wanted for n in p.claim_names)),
                        key=lambda p: (not (p.node or p.key in self.assumed
                                            or p.key in self.tasks), p.created, p.name)):
            for n in p.claim_names:
                claimant.setdefault((p.namespace, n), p.name)
        for pod in claim_pods:
            if pod.node:
                self._charge_bound(pod, live)
                self._charge_mig_claim(self.pods.items[pod.key])
                continue
            if pod.error is not None and pod.request is None:
                continue  # a claim template, or the pod's own request is invalid
            base = pod.base_request
            request, error, sched = base, None, pod.base_sched
            profile: str | None = None
            try:
                found = [self.resource_claims.items.get((pod.namespace, n))
                         for n in pod.claim_names]
                gpu = dra.pod_claims_request(found, pod.claim_names, pod.uid)
                profile = dra.claims_mig_profile([c for c in found if c is not None])
                if base is not None and (base.gpu.kind is not GpuKind.NONE or (
                        not pod.mig_claim and pod.mig_profile is not None)):
                    raise InvalidRequest("spec.resourceClaims", "the pod asks for GPUs with "
                                         "annotations or limits as well as with a claim; give "
                                         "one of them")
                for n, c in zip(pod.claim_names, found, strict=True):
                    if c is None or dra.tessera_request(c) is None:
                        continue
                    other = claimant.get((pod.namespace, n))
                    use, detail = dra.claim_use(c, pod.uid, live,
                                                None if other == pod.name else other)
                    if use == "wait":
                        raise InvalidRequest(f"resourceclaim {n}", detail.split(": ", 1)[-1])
                    if use == "join":
                        gpu = GpuRequest.none()
                        sched = _on_node(pod, detail)
                if base is not None:
                    request = dataclasses.replace(base, gpu=gpu) if profile is None else \
                        dataclasses.replace(base, gpu=gpu, gpus=profile_fraction(profile),
                                            mig=profile)
            except InvalidRequest as exc:
                request, error = None, str(exc)
                if (any((pod.namespace, n) not in self.resource_claims.items
                        for n in pod.claim_names)
                        and time.time() - pod.created < CLAIM_GRACE_SECONDS):
                    quiet.add(pod.key)
            # A MIG claim's profile is placed as the annotation's is (a MigConstraint, the
            # partition chosen at bind); the claim's allocation is the partition.
            mig = profile if profile is not None else (
                None if pod.mig_claim else pod.mig_profile)
            if (request, error, sched, mig, profile is not None) != (
                    pod.request, pod.error, pod.sched, pod.mig_profile, pod.mig_claim):
                self.pods.items[pod.key] = dataclasses.replace(
                    pod, request=request, error=error, sched=sched, mig_profile=mig,
                    mig_claim=profile is not None, version=new_version())

    def _charge_bound(self, pod: PodInfo, live: set[str]) -> None:
        """A bound pod of a shared claim: charged the claim's GPUs if it is the first live pod
        the claim is reserved for, else nothing (its CPU and memory stay its own)."""
        base = pod.base_placement
        if base is None or pod.base_request is None:
            return
        placement, request = base, pod.base_request
        for n in pod.claim_names:
            c = self.resource_claims.items.get((pod.namespace, n))
            if c is None or (base.devices and len((c.get("status") or {}).get("reservedFor")
                                                  or ()) <= 1):
                continue  # not shared: charged as its placement records
            held = dra.allocated_placement(c)
            if held is None or held.node != pod.node:
                continue
            holders = [r.get("uid") for r in dra.reserved_for(c) if r.get("uid") in live]
            if pod.uid not in holders:
                continue
            if holders[0] == pod.uid:
                gpu = dra.claim_gpu_request([c])
                ni = self.nodes.items.get(pod.node)
                if not base.devices and gpu is not None and ni is not None \
                        and ni.node is not None:  # it took over from a pod now gone
                    nbytes = _held_bytes(held, gpu, ni.node)
                    placement = dataclasses.replace(base, devices=held.devices,
                                                    request_bytes=nbytes, limit_bytes=nbytes,
                                                    exclusive=held.exclusive)
                    request = dataclasses.replace(request, gpu=gpu)
            elif base.devices:
                placement = dataclasses.replace(base, devices=(), request_bytes=(),
                                                limit_bytes=(), exclusive=False)
                request = dataclasses.replace(request, gpu=GpuRequest.none())
        if (placement, request) != (pod.placement, pod.request):
            self.pods.items[pod.key] = dataclasses.replace(
                pod, placement=placement, request=request, version=new_version())

    def _charge_mig_claim(self, pod: PodInfo) -> None:
        """A bound pod of a mig.tessera.io claim counts as its profile's fraction, as a pod
        annotated with the profile does (its placement recorded it at bind)."""
        if pod.base_request is None or pod.request is None:
            return
        try:
            profile = dra.claims_mig_profile(
                [c for n in pod.claim_names
                 if (c := self.resource_claims.items.get((pod.namespace, n))) is not None])
        except InvalidRequest:
            return
        if profile is None or pod.request.gpus is not None:
            return
        self.pods.items[pod.key] = dataclasses.replace(
            pod, request=dataclasses.replace(pod.request, gpus=profile_fraction(profile),
                                             mig=profile),
            mig_profile=profile, mig_claim=True, version=new_version())

    def _claim_partners(self, key: PodKey) -> list[PodKey]:
        """The other pods a shared claim of tessera's is reserved for (evicting one pod of a
        shared claim frees nothing while the others hold it, so they go together)."""
        pod = self.pods.items.get(key)
        if pod is None or not pod.claim_names:
            return []
        out = []
        for n in pod.claim_names:
            c = self.resource_claims.items.get((pod.namespace, n))
            if c is None or not dra.ours(c):
                continue
            for r in dra.reserved_for(c):
                other = (pod.namespace, str(r.get("name", "")))
                if other != key and other in self.pods.items:
                    out.append(other)
        return out

    async def _allocate_claims(self, pod: PodInfo, placement: Placement) -> None:
        """Writes each tessera claim's status (allocation and reservedFor this pod) before the
        pod is bound, as kube-scheduler does; a retried write is the same write. A claim
        already allocated and reserved for other live pods gets this pod appended to its
        ``reservedFor`` (a JSON patch append: pods joining at once do not conflict)."""
        for name in pod.claim_names:
            claim = self.resource_claims.items.get((pod.namespace, name))
            if claim is None:
                raise RuntimeError(f"resourceclaim {name} went away")
            request = dra.tessera_request(claim)
            if request is None or pod.request is None:
                continue
            live = ({p.uid for p in self.pods.items.values() if not p.finished}
                    if (claim.get("status") or {}).get("allocation") else set())
            use, node = dra.claim_use(claim, pod.uid, live, None)
            if use == "join":
                if node != placement.node:
                    raise RuntimeError(f"resourceclaim {name} is allocated on {node}, not "
                                       f"{placement.node}")
                refs = dra.reserved_for(claim)
                if any(r.get("uid") == pod.uid for r in refs):
                    continue
                await self.writer.claim_status_ops(pod.namespace, name, [
                    {"op": "add", "path": "/status/reservedFor/-",
                     "value": {"resource": "pods", "name": pod.name, "uid": pod.uid}}])
                continue
            if use == "wait":
                raise RuntimeError(f"resourceclaim {name}: {node}")
            if dra.claims_mig_profile([claim]) is not None:
                status = self._mig_status(pod, claim, request, placement.node)
            else:
                status = dra.allocation_status(claim, request, placement, pod.request.gpu,
                                               [(pod.name, pod.uid)])
            await self.writer.claim_status(pod.namespace, name, status)

    def _mig_status(self, pod: PodInfo, claim: dict[str, Any], request: str, node: str
                    ) -> dict[str, Any]:
        """The allocation of a MIG claim: the placement chosen at bind (tessera.core.mig.choose
        over the node's MIG GPUs), as the device tessera-node's slice offers for it."""
        mig = self.mig_assumed.get(pod.key)
        if mig is None or mig[0] != node:
            raise RuntimeError("no MIG partition was chosen for it")
        ni = self.nodes.items.get(node)
        index = next((g.index for g in (ni.mig if ni else ()) if g.uuid == mig[1].gpu), None)
        if index is None:
            raise RuntimeError(f"GPU {mig[1].gpu} is no longer in MIG mode on {node}")
        return dra.mig_allocation_status(claim, request, node, index, mig[1].profile,
                                         mig[1].start, [(pod.name, pod.uid)])

    async def _release_claim(self, key: PodKey) -> None:
        """Deallocates a claim of tessera's whose pods are gone or finished (kube-scheduler
        does the same for its own allocations)."""
        try:
            await self.writer.claim_status(key[0], key[1], {"reservedFor": None,
                                                            "allocation": None})
            log.info("resourceclaim %s/%s deallocated: its pods are gone", *key)
        except Exception as exc:
            if status_code(exc) != 404:
                log.warning("deallocating resourceclaim %s/%s: %r", *key, exc)
        finally:
            self.releasing.discard(key)

    async def _prune_claim(self, key: PodKey, keep: list[dict[str, str]], rv: str | None
                           ) -> None:
        """Drops the pods that are gone from a shared claim's ``reservedFor`` (kube-controller-
        manager's resourceclaim controller does this for kube-scheduler's claims)."""
        try:
            await self.writer.claim_status_ops(key[0], key[1], [
                {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                {"op": "replace", "path": "/status/reservedFor", "value": keep}])
        except Exception as exc:
            if status_code(exc) not in (404, 409, 422):
                log.warning("updating reservedFor of resourceclaim %s/%s: %r", *key, exc)
        finally:
            self.releasing.discard(key)

    def _mig(self) -> MigView:
        """The MIG GPUs with the partitions bound and assumed pods hold (tessera.kube.mig)."""
        gpus = {n: ni.mig for n, ni in self.nodes.items.items() if ni.mig}
        if not gpus:
            return MigView()
        holds = [(p.node, p.mig_hold, f"{p.namespace}/{p.name}") for p in self.pods.items.values()
                 if p.node and p.mig_hold is not None and not p.finished]
        # mig.tessera.io claims hold the placement of their allocation, whoever allocated it
        # (made by the kubelet plugin at prepare, or still to be made); as no pod's: evicting
        # a pod does not free a claim's partition until the claim is deallocated and
        # unprepared, which the cycle cannot follow, so it is never a MIG victim.
        allocated: set[PodKey] = set()
        for key, claim in self.resource_claims.items.items():
            for node, index, profile, start in dra.mig_allocations(claim):
                uuid_ = next((g.uuid for g in gpus.get(node, ()) if g.index == index), None)
                if uuid_ is not None:
                    holds.append((node, MigHold(uuid_, profile, start), ""))
                    allocated.add(key)
        for key in [k for k, _ in self.mig_assumed.items()
                    if (p := self.pods.items.get(k)) is not None and p.node and p.mig_claim
                    and all((p.namespace, n) in allocated for n in p.claim_names)]:
            del self.mig_assumed[key]  # the claim's allocation holds it now
        assumed = [(node, hold, f"{key[0]}/{key[1]}") for key, (node, hold) in self.mig_assumed.items()]
        view = MigView.build(gpus, [*holds, *assumed])
        view.serving_nodes = frozenset(n for n in view.nodes if self._serves_shares(n))
        return view

    def _serves_shares(self, node: str) -> bool:
        """Whether the operator let this node's MIG GPUs serve shares (its label
        ``tessera.io/mig-serves-shares``); a value that is neither true nor false is said in
        the log, once per value, and taken as false."""
        ni = self.nodes.items.get(node)
        value = ni.labels.get(SERVES_SHARES) if ni is not None else None
        if value is None:
            return False
        try:
            return parse_serves_shares(value, f"node {node} metadata.labels[{SERVES_SHARES}]")
        except InvalidRequest as exc:
            if self.serving_errors.get(node) != value:
                self.serving_errors[node] = value
                log.warning("%s; its MIG GPUs do not serve shares", exc)
            return False

    def _serve_shares(self) -> None:
        """Shares that waited for room on the shared GPUs (``mig_serving``) are placed this
        cycle as pods of the smallest profile that holds them, on the nodes labelled
        ``tessera.io/mig-serves-shares=true`` only, while one of those has room for it; else
        they stay shares (docs/mig.md). Recomputed each cycle, as room comes and goes."""
        view = self.mig_view
        models = sorted({g.model for n in view.serving_nodes for g in view.nodes.get(n, ())})
        for key, share in list(self.mig_serving.items()):
            pod = self.pods.items.get(key)
            if pod is None or pod.node or pod.request is None or not (
                    pod.mig_served or _servable(pod)):
                del self.mig_serving[key]
                continue
            fits = sorted({p for m in models if (p := serving_profile(share, m)) is not None},
                          key=lambda p: (p.slots, p.compute, p.name))
            profile = next((p for p in fits if view.serving_nodes & set(view.room(p.name)[0])),
                           None)
            if profile is not None:
                request = dataclasses.replace(pod.request, gpu=GpuRequest.none(),
                                              gpus=profile.fraction)
                served: tuple[Any, ...] = (request, profile.name, True)
            else:
                served = (dataclasses.replace(pod.request, gpu=share, gpus=None), None, False)
            if served != (pod.request, pod.mig_profile, pod.mig_served):
                self.pods.items[key] = dataclasses.replace(
                    pod, request=served[0], mig_profile=served[1], mig_served=served[2],
                    version=new_version())

    async def cycle(self) -> Plan | None:
        t0 = time.perf_counter()
        self._apply_claims()
        self.mig_view = self._mig()
        self._evict_blocked_mig()
        if self.mig_serving:
            self._serve_shares()
        snapshot, ctx = self.snapshots.build(
            self.nodes.items, self.pods.items, self.projects.items, self.pod_groups.items,
            self.assumed, self.evicting, time.time(),
            {n: (v[0], v[1], v[2]) for n, v in self.foreign.items()},
            self.foreign_pods.items.values(), self.namespaces.items, self.claims.items,
            self._unmovable_now(), self.mig_view)
        config = self.opts.cycle_config(bool(self.evicting))
        try:
            plan = await asyncio.to_thread(run_cycle, snapshot, config)
        except InvalidRequest as exc:
            log.error("cycle refused the snapshot: %s", exc)
            ctx.conflicts = find_conflicts(snapshot, ctx, self.pods.items)
            self._evict_lost(ctx)
            return None
        self.cycles += 1
        self.apply(plan, ctx)
        self.last_cycle_seconds = time.perf_counter() - t0
        metrics.CYCLE_SECONDS.observe(self.last_cycle_seconds)
        if plan.bindings or plan.evictions:
            log.info("cycle %d: %d workloads, %d bindings, %d evictions, %d waiting in %.3fs "
                     "(core %.3fs)", self.cycles, len(snapshot.workloads), len(plan.bindings),
                     len(plan.evictions), len(plan.waiting), self.last_cycle_seconds,
                     plan.timings.get("total", 0.0))
        return plan

    # ---- applying a plan -----------------------------------------------------------------
    def _unmovable_now(self) -> set[PodKey]:
        now = time.monotonic()
        for key in [k for k, until in self.unmovable.items() if until <= now]:
            del self.unmovable[key]
        return set(self.unmovable)

    def _apply_moves(self, plan: Plan, ctx: Context) -> list[PodKey]:
        """Evict the pods consolidation moves (their controllers recreate them, and the next
        cycles place the new pods); returns them, for the bindings that need their room."""
        moved: list[PodKey] = []
        waiting_for = [b for b in plan.bindings if b.action == "consolidate"]
        for m in plan.moves:
            key = ctx.pods_of[m.workload_id][m.pod]
            pod = self.pods.items.get(key)
            if pod is None or key in self.evicting or not pod.node:
                continue
            self.evicting.add(key)
            moved.append(key)
            message = (f"{m.reason} (from {m.source.node} to {m.target.node}): evicted through the "
                       f"Eviction API; its {pod.owner or 'controller'} recreates it")
            self._spawn(self._move(pod, message, [ctx.pods_of[b.workload_id][pb.pod]
                                                  for b in waiting_for for pb in b.pods]))
        return moved

    async def _move(self, pod: PodInfo, message: str, dependents: list[PodKey]) -> None:
        try:
            await self.writer.evict_api(pod, "Moved", message)
        except Exception as exc:
            # A PodDisruptionBudget (429) or anything else: the room is not made, so the
            # bindings waiting for it are called off; the pod is not moved again for a while.
            log.info("moving %s/%s refused: %r", pod.namespace, pod.name, exc)
            self.evicting.discard(pod.key)
            self.unmovable[pod.key] = time.monotonic() + UNMOVABLE_SECONDS
            why = exc.status.message if isinstance(exc, ApiError) and exc.status else str(exc)
            self._spawn(self.writer.event(pod, "NotMoved", f"consolidation wanted to move it but the "
                                          f"eviction was refused: {why}; not tried again for "
                                          f"{UNMOVABLE_SECONDS:.0f}s", "Warning"))
            for key in dependents:
                task = self.tasks.pop(key, None)
                if task is not None:
                    task.cancel()
                self.assumed.pop(key, None)
                self.mig_assumed.pop(key, None)
            self.wake.set()

    def apply(self, plan: Plan, ctx: Context) -> None:
        pods = self.pods.items
        moved = self._apply_moves(plan, ctx)
        for e in plan.evictions:
            for key in ctx.pods_of.get(e.workload_id, []):
                pod = pods.get(key)
                if pod is None or key in self.evicting:
                    continue
                if not pod.node and key not in self.assumed:
                    continue
                task = self.tasks.pop(key, None)
                if task is not None:
                    task.cancel()
                self.assumed.pop(key, None)
                self.mig_assumed.pop(key, None)
                self.evicting.add(key)
                reason = {"reclaim": "Reclaimed", "preempt": "Preempted"}.get(e.action, "Evicted")
                metrics.EVICTIONS.labels(reason).inc()
                self._spawn(self.writer.evict(pod, reason, e.reason))
                for other in self._claim_partners(key):
                    # The claim's GPU is freed only when all its pods are gone.
                    partner = pods.get(other)
                    if partner is None or other in self.evicting:
                        continue
                    self.evicting.add(other)
                    metrics.EVICTIONS.labels(reason).inc()
                    self._spawn(self.writer.evict(
                        partner, reason, f"{e.reason} (it shares a ResourceClaim with "
                        f"{pod.namespace}/{pod.name}, which was evicted)"))
        for b in plan.bindings:
            keys = ctx.pods_of[b.workload_id]
            victims = [k for wid in b.after_evictions for k in ctx.pods_of.get(wid, [])]
            victims += [o for v in victims for o in self._claim_partners(v)]
            if b.action == "consolidate":
                victims += moved
            for pb in b.pods:
                key = keys[pb.pod]
                pod = pods.get(key)
                if pod is None or pod.node or key in self.assumed:
                    continue
                failed = self.bind_failures.get(key)
                if failed is not None and time.monotonic() < failed[2]:
                    continue
                if pod.mig_profile is not None:
                    # The cycle chose the partition (PodBinding.mig) with its victims' idle.
                    self.mig_view.release(pb.placement.node, (f"{k[0]}/{k[1]}" for k in victims))
                    if not self._choose_mig(pod, pb.placement.node, pb.mig):
                        continue  # taken by another pod of this cycle: the next cycle looks again
                self.assumed[key] = pb.placement
                self.report.forget(key)
                task = asyncio.create_task(self._bind(key, pb.placement, victims))
                self.tasks[key] = task
        waits = dict(ctx.waits)
        for w in plan.waiting:
            for key in ctx.pods_of.get(w.workload_id, []):
                pod = pods.get(key)
                if pod is not None and not pod.node and key not in self.assumed:
                    waits[key] = w.reason
                    if (w.kind in SERVABLE_WAITS and self.mig_view.serving_nodes
                            and not pod.mig_served and _servable(pod)):
                        assert pod.request is not None
                        self.mig_serving[key] = pod.request.gpu
        for key, message in waits.items():
            pod = pods.get(key)
            if pod is not None and ctx.agents_not_ready and pod.request is not None \
                    and pod.request.gpu.kind is not GpuKind.NONE:
                message = f"{message}; {agents_not_ready_text(ctx.agents_not_ready)}"
            if pod is not None and key not in self.claims_unseen:
                self.report.waiting(pod, message)
        metrics.set_pending(waits.values())
        self._evict_lost(ctx)
        self.report.projects(plan, self.projects.items)

    def _choose_mig(self, pod: PodInfo, node: str, chosen: MigChoice | None = None) -> bool:
        """The GPU and slot of a MIG pod's partition on the node the cycle chose: ``chosen``
        (the cycle's, over the same view), else ``choose`` now (an idle one of the profile,
        else the slot that fragments least, else after removing idle ones)."""
        assert pod.mig_profile is not None
        gpus = self.mig_view.nodes.get(node)
        choice = chosen if gpus and chosen is not None and any(
            g.key == chosen.gpu for g in gpus) else choose(gpus, pod.mig_profile) if gpus else None
        if gpus is None or choice is None:
            return False
        self.mig_assumed[pod.key] = (node, apply_choice(gpus, pod.mig_profile, choice))
        return True

    def _served_data(self, node: str, hold: MigHold, share: GpuRequest) -> dict[str, str]:
        """ConfigMap keys of a share a partition serves, beside the MIG ones: the limit its
        container's isolation library reads (the share's limit on the whole GPU, at most the
        partition's memory, which holds its request; MIG caps the rest in hardware)."""
        ni = self.nodes.items.get(node)
        model = next((g.model for g in (ni.mig if ni is not None else ()) if g.uuid == hold.gpu),
                     "")
        sizes = MEMORY_MIB.get(model, {})
        part = sizes.get(hold.profile, 0) * 2**20
        whole = (GPU_MODELS[model].memory_mib if model in GPU_MODELS
                 else max(sizes.values(), default=0)) * 2**20
        limit = min(part, share.limit_bytes_on(whole))
        return {"TESSERA_GPU_MEMORY_LIMIT": str(limit), "TESSERA_GPU_MEMORY_REQUEST":
                str(min(part, share.bytes_on(whole))), "TESSERA_MIG_SERVES_SHARE": "true",
                "TESSERA_ISOLATION": "on"}

    def _evict_blocked_mig(self) -> None:
        """A bound MIG pod whose slot a partition tessera did not make has taken since the
        bind (an operator's, made behind the scheduler's back) can never get its partition:
        it is evicted, so its controller's new pod is placed again, instead of waiting bound
        for ever (tessera.kube.mig.blocked)."""
        if not self.mig_view.nodes:
            return  # no GPU in MIG mode: nothing to look at in this cycle's pods
        for pod in list(self.pods.items.values()):
            hold = pod.mig_hold
            info = self.nodes.items.get(pod.node or "")
            if hold is None or pod.finished or info is None or not info.mig \
                    or pod.key in self.evicting:
                continue
            taken = blocked(info.mig, hold)
            if taken is None:
                continue
            self.evicting.add(pod.key)
            metrics.EVICTIONS.labels("MIGSlotTaken").inc()
            self._spawn(self.writer.evict(pod, "MIGSlotTaken", (
                f"its MIG {hold.profile} at memory slot {hold.start} of GPU {hold.gpu} cannot be "
                f"made: a {taken.profile} partition tessera did not make now sits at memory slot "
                f"{taken.start}; evicted so it is placed again")))

    def _evict_lost(self, ctx: Context) -> None:
        for pod in ctx.orphans + ctx.conflicts:
            if pod.key in self.evicting:
                continue
            self.evicting.add(pod.key)
            lost = pod in ctx.orphans
            metrics.EVICTIONS.labels("NodeLost" if lost else "Conflict").inc()
            why = (f"node {pod.node} was deleted while the pod was bound to it" if lost
                   else "its recorded GPU placement collides with another pod")
            self._spawn(self.writer.evict(pod, "NodeLost" if lost else "Conflict", why))

    async def _wait_gone(self, keys: list[PodKey], timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while any(k in self.pods.items for k in keys):
            if time.monotonic() > deadline:
                raise TimeoutError("evicted pods did not go away")
            await asyncio.sleep(0.05)

    async def _bind(self, key: PodKey, placement: Placement, victims: list[PodKey]) -> None:
        try:
            if victims:
                await self._wait_gone(victims)
            pod = self.pods.items.get(key)
            if pod is None or pod.node:
                self.assumed.pop(key, None)
                return
            annotations: dict[str, str] = {}
            mig = self.mig_assumed.get(key)
            served = self.mig_serving.get(key) if mig is not None and not pod.claim_names \
                and names.MIG_PROFILE not in pod.annotations else None
            if (pod.mig_profile is not None and not pod.mig_claim) or served is not None:
                if mig is None or mig[0] != placement.node:
                    raise RuntimeError("no MIG partition was chosen for it")
                data = {"TESSERA_MIG_PROFILE": mig[1].profile, "TESSERA_MIG_GPU": mig[1].gpu,
                        "TESSERA_NODE": placement.node}
                if served is not None:
                    data.update(self._served_data(placement.node, mig[1], served))
                    annotations[names.MIG_SHARE] = json.dumps(
                        {"request": int(data["TESSERA_GPU_MEMORY_REQUEST"]),
                         "limit": int(data["TESSERA_GPU_MEMORY_LIMIT"])}, separators=(",", ":"))
                annotations[names.CONFIGMAP] = await self.writer.write_configmap(pod, data)
                annotations[names.MIG_PARTITION] = mig[1].to_json()
            elif placement.devices and not placement.exclusive and not pod.claim_names:
                # A claim's share needs no reservation pod: its allocation holds the GPU, and
                # on a DRA node there is no nvidia.com/gpu for a reservation to take.
                uuids = [await self.reservations.reserve(placement.node, d) for d in placement.devices]
                ni = self.nodes.items.get(placement.node)
                if ni is None or ni.node is None:
                    raise RuntimeError(f"node {placement.node} went away")
                memory = [ni.node.gpus[d].memory for d in placement.devices]
                data = self.writer.configmap_data(placement, uuids, memory)
                pod = self.pods.items.get(key)
                if pod is None or pod.node:
                    self.assumed.pop(key, None)
                    return
                annotations[names.CONFIGMAP] = await self.writer.write_configmap(pod, data)
                annotations[names.NODE_GPU_UUIDS] = ",".join(uuids)
            if pod.claim_names:
                await self._allocate_claims(pod, placement)
            await self.writer.bind(pod, placement, annotations)
            self.bound += 1
            metrics.BINDINGS.inc()
            self.bind_failures.pop(key, None)
            how = "" if served is None else (f" (served by MIG {mig[1].profile} on GPU "
                                             f"{mig[1].gpu})" if mig is not None else "")
            self._spawn(self.writer.notice(
                pod, "Scheduled",
                f"Successfully assigned {pod.namespace}/{pod.name} to {placement.node}{how}"))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self.assumed.get(key) is placement:
                del self.assumed[key]
                self.mig_assumed.pop(key, None)
            log.warning("binding %s/%s to %s failed: %r", key[0], key[1], placement.node, exc)
            metrics.BINDING_FAILURES.inc()
            pod = self.pods.items.get(key)
            error = str(exc)
            last, count, _ = self.bind_failures.get(key, ("", 0, 0.0))
            count = count + 1 if error == last else 1
            # Back off (0.5 s doubling to 60 s) and tell the pod once per distinct error.
            self.bind_failures[key] = (error, count, time.monotonic() + min(60.0, 0.5 * 2 ** (count - 1)))
            if pod is not None and count == 1 and not (isinstance(exc, ApiError) and exc.status.code == 404):
                self._spawn(self.writer.event(
                    pod, "FailedBinding", f"binding to {placement.node} failed: {exc} (retried with "
                    "back-off; this Event is not repeated while the error stays the same)", "Warning"))
            self.wake.set()
        finally:
            if self.tasks.get(key) is asyncio.current_task():
                del self.tasks[key]

    # ---- cleaning up half-done work ----------------------------------------------------------
    async def _drop_configmap(self, ns: str, name: str, pod_name: str) -> None:
        """Deletes a pod's ConfigMap once the API server itself says the pod is gone or unbound:
        the cache can lag (a watch reconnecting after an outage), and a binding whose answer was
        lost (the API server died after committing it) has bound the pod although the bind
        call failed; deleting on the cache's word left such a pod bound with no ConfigMap."""
        try:
            try:
                live = await self.client.get(Pod, pod_name, namespace=ns)
            except ApiError as exc:
                if exc.status.code != 404:
                    return
                live = None
            if live is not None and live.spec is not None and live.spec.nodeName:
                return
            await self.writer.delete_configmap(ns, name)
            self.configmaps.items.pop((ns, name), None)
        except Exception as exc:  # the API server unreachable: judged again next time
            log.info("ConfigMap %s/%s kept for now: %r", ns, name, exc)
        finally:
            self.configmaps_checking.discard((ns, name))

    async def cleanup(self) -> None:
        """Delete reservation pods with no tenants, ConfigMaps whose pod is gone or unbound (and
        not being bound), and shared pods whose reservation pod vanished."""
        self.reservations.release_unused(
            Reservations.tenants(self.pods.items.values(), self.assumed), self._spawn)
        for (ns, name), cm in list(self.configmaps.items.items()):
            if cm.pod is None or (ns, name) in self.configmaps_checking:
                continue
            pod = self.pods.items.get((ns, cm.pod))
            if pod is None or (not pod.node and (ns, cm.pod) not in self.assumed
                               and (ns, cm.pod) not in self.tasks):
                self.configmaps_checking.add((ns, name))
                self._spawn(self._drop_configmap(ns, name, cm.pod))
        self._apply_claims()  # who is charged a shared claim, before reservations are judged
        live = {p.uid for p in self.pods.items.values() if not p.finished}
        for key, claim in list(self.resource_claims.items.items()):
            if key in self.releasing:
                continue
            if dra.released(claim, live):
                self.releasing.add(key)
                self._spawn(self._release_claim(key))
            elif dra.ours(claim):
                refs = dra.reserved_for(claim)
                keep = [r for r in refs if r.get("uid") in live]
                if len(keep) < len(refs):
                    self.releasing.add(key)
                    self._spawn(self._prune_claim(
                        key, keep, (claim.get("metadata") or {}).get("resourceVersion")))
        for pod in list(self.pods.items.values()):
            if (pod.reservation is not None or not pod.node or pod.placement is None
                    or pod.placement.exclusive or pod.finished or pod.key in self.evicting
                    or pod.claim_names):
                continue
            missing = self.reservations.missing(pod.node, pod.placement.devices)
            if missing and pod.node in self.nodes.items:
                self.evicting.add(pod.key)
                self._spawn(self.writer.evict(
                    pod, "GPUReservationLost",
                    f"the reservation pod holding its GPU on {pod.node} (device {missing[0]}) "
                    "disappeared, so the GPU may be given to another pod"))


# ---- process --------------------------------------------------------------------------------
async def _main(args: argparse.Namespace) -> int:
    config = KubeConfig.from_file(args.kubeconfig) if args.kubeconfig else None
    client = AsyncClient(config, field_manager=names.COMPONENT, timeout=None, http2=args.http2)
    opts = options_from_args(args)
    identity = args.identity or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    health = start_health_server(args.health_address, args.health_port) \
        if args.health_port else None
    try:
        return await _run(args, client, config, opts, identity, stop)
    finally:
        if health is not None:
            health.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await health


async def _run(args: argparse.Namespace, client: AsyncClient, config: Any, opts: Options,
               identity: str, stop: asyncio.Event) -> int:
    elector = None
    if args.leader_elect:
        # Its own connection: renewals must not queue behind the scheduler's traffic.
        lease_client = AsyncClient(config, field_manager=names.COMPONENT)
        elector = LeaderElector(lease_client, args.system_namespace, args.lease_name, identity,
                                lease_duration=args.lease_duration,
                                renew_deadline=args.lease_duration * 2 / 3,
                                retry_period=max(0.2, args.lease_duration / 7.5))
        sched0 = KubeScheduler(client, opts)
        await sched0.ensure_system_namespace()
        acquire = asyncio.create_task(elector.acquire())
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({acquire, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            acquire.cancel()
            return 0
        print(f"leader: {identity}", flush=True)
    raw = RawApi(client.config, connections=min(opts.concurrency, 32)) if args.raw_http else None
    sched = KubeScheduler(client, opts, raw)
    runner = asyncio.create_task(sched.run())
    waits: set[asyncio.Task[Any]] = {runner, asyncio.create_task(stop.wait())}
    keeper = asyncio.create_task(elector.keep()) if elector else None
    if keeper:
        waits.add(keeper)
    done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    runner.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await runner
    code = 0
    if keeper is not None:
        if keeper in done:
            exc = keeper.exception()
            log.error("%s; stopping", exc)
            code = 1 if isinstance(exc, LostLeadership) else 2
        else:
            keeper.cancel()
            await elector.release()  # type: ignore[union-attr]
    if runner in done and not runner.cancelled() and runner.exception() is not None:
        log.error("scheduler failed: %r", runner.exception())
        code = 2
    return code


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def options_from_args(args: argparse.Namespace) -> Options:
    return Options(system_namespace=args.system_namespace, concurrency=args.concurrency,
                   reservation_image=args.reservation_image, policy=args.policy,
                   reclaim=args.reclaim, min_runtime=args.min_runtime_seconds)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tessera-scheduler",
                                     description="tessera's GPU-sharing Kubernetes scheduler")
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                        help="kubeconfig file (default: $KUBECONFIG, else in-cluster)")
    parser.add_argument("--system-namespace", default=names.SYSTEM_NAMESPACE,
                        help="namespace of reservation pods and the leader Lease")
    parser.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--lease-name", default=names.LEASE_NAME)
    parser.add_argument("--lease-duration", type=float, default=15.0, help="seconds")
    parser.add_argument("--identity", default="", help="leader election identity")
    parser.add_argument("--concurrency", type=int, default=32, help="API writes in flight")
    parser.add_argument("--reservation-image", default="registry.k8s.io/pause:3.10")
    parser.add_argument("--policy", default=None, choices=POLICIES,
                        help=f"placement policy (default: {DEFAULT_POLICY})")
    parser.add_argument("--reclaim", action=argparse.BooleanOptionalAction, default=True,
                        help="give GPUs lent over quota back to projects below their share")
    parser.add_argument("--min-runtime-seconds", type=_seconds, default=0.0, metavar="SECONDS",
                        help="a pod runs at least this long before reclaim or preemption may "
                        "evict it (a Project's own value wins)")
    parser.add_argument("--http2", action=argparse.BooleanOptionalAction, default=False,
                        help="one multiplexed HTTP/2 connection to the API server")
    parser.add_argument("--raw-http", action=argparse.BooleanOptionalAction, default=True,
                        help="lean HTTP/1.1 client for bindings, ConfigMaps and reservation pods")
    parser.add_argument("--health-port", type=int, default=0,
                        help="serve GET /healthz (liveness probe) on this port; 0: off")
    parser.add_argument("--health-address", default="0.0.0.0")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return asyncio.run(_main(args))


if __name__ == "__main__":
    sys.exit(main())

"""DRA ResourceClaims in the cycle: the request a pod's claims make, and their upkeep.

Each cycle, a pod naming ResourceClaims gets the request its claims make (tessera.kube.claims),
or the reason it waits. A claim is allocated once, for the first pod that uses it; a pending
pod whose claim is allocated and reserved for other live pods joins it: it asks for no GPU and
is held to the allocation's node. Of the bound pods sharing a claim, the first live one in its
``reservedFor`` is charged the claim's GPUs, the others nothing, so quota, fair share and
placement count a shared claim once for as long as any of its pods lives. The claim's
allocation itself is written at bind (tessera.kube.bind.claim_allocation).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from tessera.core.errors import InvalidRequest
from tessera.core.mig import profile_fraction
from tessera.core.model import GpuKind, GpuRequest
from tessera.core.state import Placement
from tessera.core.units import portion_bytes
from tessera.kube import claims as dra
from tessera.kube.hooks.base import CycleHook
from tessera.kube.objects import PodInfo, PodKey
from tessera.kube.podview import Overlay
from tessera.kube.predicates.selectors import NodeSelectorTerm, Requirement
from tessera.kube.predicates.spec import SchedulingSpec
from tessera.kube.retry import status_code

log = logging.getLogger("tessera.kube")

CLAIM_GRACE_SECONDS = 5.0
"""How long a new pod's missing ResourceClaim is taken for one whose watch event has not arrived
yet (created just before the pod) before the pod is told it is missing."""


def held_to_node(pod: PodInfo, node: str) -> SchedulingSpec:
    """The pod's scheduling spec held to ``node`` as well (required node affinity on
    metadata.name, ANDed into each of its terms)."""
    base = pod.sched or SchedulingSpec(pod.namespace, tuple(sorted(pod.labels.items())))
    req = Requirement("metadata.name", "In", (node,))
    terms = base.required_terms if base.required_terms is not None else (NodeSelectorTerm(),)
    return dataclasses.replace(base, required_terms=tuple(
        dataclasses.replace(t, fields=(*t.fields, req)) for t in terms))


def held_bytes(held: Placement, gpu: GpuRequest, node: Any) -> tuple[int, ...]:
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


class ClaimHook(CycleHook):
    """Registered first: it derives from the pods as parsed."""

    name = "claims"
    unseen: set[PodKey]
    """Pending pods whose claim this scheduler has not seen yet, created moments ago (the
    claim's watch event is on its way): they wait without a condition or Event."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.unseen = set()
        self.releasing: set[PodKey] = set()
        """ResourceClaims being deallocated or pruned (tessera.kube.claims.released)."""

    @property
    def _claims(self) -> dict[PodKey, dict[str, Any]]:
        return self.parts.caches.resource_claims.items

    def derive(self) -> Overlay:
        quiet: set[PodKey] = set()
        self.unseen = quiet
        overlay: Overlay = {}
        source = self.parts.caches.pods.items
        claim_pods = [p for p in source.values()
                      if p.claim_names and p.reservation is None and not p.finished]
        if not claim_pods:
            return overlay
        inflight = self.parts.inflight
        live = {p.uid for p in source.values() if not p.finished}
        wanted = {(p.namespace, n) for p in claim_pods if not p.node for n in p.claim_names}
        claimant: dict[PodKey, str] = {}
        for p in sorted((p for p in claim_pods
                         if any((p.namespace, n) in wanted for n in p.claim_names)),
                        key=lambda p: (not (p.node or p.key in inflight.assumed
                                            or p.key in inflight.tasks), p.created, p.name)):
            for n in p.claim_names:
                claimant.setdefault((p.namespace, n), p.name)
        for pod in claim_pods:
            if pod.node:
                changes = self._charge_bound(pod, live)
                changes.update(self._charge_mig_claim(
                    dataclasses.replace(pod, **changes) if changes else pod))
            elif pod.error is not None and pod.request is None:
                continue  # a claim template, or the pod's own request is invalid
            else:
                changes = self._pending(pod, live, claimant, quiet)
            if changes:
                overlay[pod.key] = changes
        return overlay

    def _pending(self, pod: PodInfo, live: set[str], claimant: dict[PodKey, str],
                 quiet: set[PodKey]) -> dict[str, Any]:
        base = pod.request
        request, error, sched = base, None, pod.sched
        profile: str | None = None
        try:
            found = [self._claims.get((pod.namespace, n)) for n in pod.claim_names]
            gpu = dra.pod_claims_request(found, pod.claim_names, pod.uid)
            profile = dra.claims_mig_profile([c for c in found if c is not None])
            if base is not None and (base.gpu.kind is not GpuKind.NONE
                                     or pod.mig_profile is not None):
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
                    sched = held_to_node(pod, detail)
            if base is not None:
                request = dataclasses.replace(base, gpu=gpu) if profile is None else \
                    dataclasses.replace(base, gpu=gpu, gpus=profile_fraction(profile),
                                        mig=profile)
        except InvalidRequest as exc:
            request, error = None, str(exc)
            if (any((pod.namespace, n) not in self._claims for n in pod.claim_names)
                    and time.time() - pod.created < CLAIM_GRACE_SECONDS):
                quiet.add(pod.key)
        # A MIG claim's profile is placed as the annotation's is (a MigConstraint, the
        # partition chosen at bind); the claim's allocation is the partition.
        mig = profile if profile is not None else pod.mig_profile
        return {"request": request, "error": error, "sched": sched, "mig_profile": mig,
                "mig_claim": profile is not None}

    def _charge_bound(self, pod: PodInfo, live: set[str]) -> dict[str, Any]:
        """A bound pod of a shared claim: charged the claim's GPUs if it is the first live pod
        the claim is reserved for, else nothing (its CPU and memory stay its own)."""
        base = pod.placement
        if base is None or pod.request is None:
            return {}
        placement, request = base, pod.request
        for n in pod.claim_names:
            c = self._claims.get((pod.namespace, n))
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
                ni = self.parts.caches.nodes.items.get(pod.node)
                if not base.devices and gpu is not None and ni is not None \
                        and ni.node is not None:  # it took over from a pod now gone
                    nbytes = held_bytes(held, gpu, ni.node)
                    placement = dataclasses.replace(base, devices=held.devices,
                                                    request_bytes=nbytes, limit_bytes=nbytes,
                                                    exclusive=held.exclusive, compute=held.compute)
                    request = dataclasses.replace(request, gpu=gpu)
            elif base.devices:
                placement = dataclasses.replace(base, devices=(), request_bytes=(),
                                                limit_bytes=(), exclusive=False, compute=0)
                request = dataclasses.replace(request, gpu=GpuRequest.none())
        if (placement, request) == (pod.placement, pod.request):
            return {}
        return {"placement": placement, "request": request}

    def _charge_mig_claim(self, pod: PodInfo) -> dict[str, Any]:
        """A bound pod of a mig.tessera.io claim counts as its profile's fraction, as a pod
        annotated with the profile does (its placement recorded it at bind)."""
        if pod.request is None:
            return {}
        try:
            profile = dra.claims_mig_profile(
                [c for n in pod.claim_names
                 if (c := self._claims.get((pod.namespace, n))) is not None])
        except InvalidRequest:
            return {}
        if profile is None or pod.request.gpus is not None:
            return {}
        return {"request": dataclasses.replace(pod.request, gpus=profile_fraction(profile),
                                               mig=profile),
                "mig_profile": profile, "mig_claim": True}

    def partners(self, key: PodKey) -> list[PodKey]:
        """The other pods a shared claim of tessera's is reserved for (evicting one pod of a
        shared claim frees nothing while the others hold it, so they go together)."""
        pods = self.parts.pods
        pod = pods.get(key)
        if pod is None or not pod.claim_names:
            return []
        out = []
        for n in pod.claim_names:
            c = self._claims.get((pod.namespace, n))
            if c is None or not dra.ours(c):
                continue
            for r in dra.reserved_for(c):
                other = (pod.namespace, str(r.get("name", "")))
                if other != key and other in pods:
                    out.append(other)
        return out

    def silent(self, key: PodKey) -> bool:
        return key in self.unseen

    def collect(self) -> None:
        """Deallocates claims of tessera's whose pods are gone or finished, and drops gone pods
        from a shared claim's ``reservedFor`` (kube-scheduler and kube-controller-manager's
        resourceclaim controller do this for kube-scheduler's claims)."""
        # Who is charged a shared claim, before reservations are judged.
        self.parts.pods.lay(self.name, self.derive())
        live = {p.uid for p in self.parts.caches.pods.items.values() if not p.finished}
        for key, claim in list(self._claims.items()):
            if key in self.releasing:
                continue
            if dra.released(claim, live):
                self.releasing.add(key)
                self.parts.spawn(self._release(key))
            elif dra.ours(claim):
                refs = dra.reserved_for(claim)
                keep = [r for r in refs if r.get("uid") in live]
                if len(keep) < len(refs):
                    self.releasing.add(key)
                    self.parts.spawn(self._prune(
                        key, keep, (claim.get("metadata") or {}).get("resourceVersion")))

    async def _release(self, key: PodKey) -> None:
        try:
            await self.parts.writer.claim_status(key[0], key[1], {"reservedFor": None,
                                                                  "allocation": None})
            log.info("resourceclaim %s/%s deallocated: its pods are gone", *key)
        except Exception as exc:
            if status_code(exc) != 404:
                log.warning("deallocating resourceclaim %s/%s: %r", *key, exc)
        finally:
            self.releasing.discard(key)

    async def _prune(self, key: PodKey, keep: list[dict[str, str]], rv: str | None) -> None:
        try:
            await self.parts.writer.claim_status_ops(key[0], key[1], [
                {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                {"op": "replace", "path": "/status/reservedFor", "value": keep}])
        except Exception as exc:
            if status_code(exc) not in (404, 409, 422):
                log.warning("updating reservedFor of resourceclaim %s/%s: %r", *key, exc)
        finally:
            self.releasing.discard(key)

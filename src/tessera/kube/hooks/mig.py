"""MIG in the cycle: the partitions held, shares a partition serves, the partition chosen.

Each cycle builds the view of the MIG GPUs with the partitions bound and assumed pods hold
(tessera.kube.mig), evicts a bound pod whose slot a partition tessera did not make has taken,
and places the shares that waited for room on the shared GPUs as pods of the smallest profile
that holds them, on nodes labelled ``tessera.io/mig-serves-shares=true`` (docs/mig.md). When a
binding of a MIG pod starts, the partition is chosen (``reserve``); the bind steps
tessera.kube.bind.mig_partition and served_share write it.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from tessera.core.cycle import PodBinding
from tessera.core.errors import InvalidRequest
from tessera.core.mig import (
    SERVABLE_WAITS,
    SERVES_SHARES,
    choose,
    parse_serves_shares,
    serving_profile,
)
from tessera.core.model import GpuRequest
from tessera.kube import claims as dra
from tessera.kube import metrics
from tessera.kube.hooks.base import CycleHook
from tessera.kube.inflight import MigAssumed
from tessera.kube.mig import MigHold, MigView, apply_choice, blocked
from tessera.kube.objects import PodInfo, PodKey
from tessera.kube.podview import Overlay

log = logging.getLogger("tessera.kube")



def servable(pod: PodInfo) -> bool:
    """A pending share a partition could serve: one device, its own pod (no PodGroup), no
    ResourceClaim, no MIG profile of its own."""
    return (pod.request is not None and pod.request.gpu.shared and pod.request.gpu.devices == 1
            and pod.group is None and not pod.claim_names and pod.mig_profile is None
            and pod.reservation is None)


class MigHook(CycleHook):
    name = "mig"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.view = MigView()
        """This cycle's MIG GPUs and the partitions held on them."""
        self.serving: dict[PodKey, GpuRequest] = {}
        """Pending shares that waited for room on the shared GPUs, with their request: served
        by the smallest MIG profile that holds them where a node allows it (docs/mig.md)."""
        self.serving_errors: dict[str, str] = {}
        """node -> the bad value of its label tessera.io/mig-serves-shares already logged."""

    def derive(self) -> Overlay:
        self.view = self._build_view()
        return self._serve_shares() if self.serving else {}

    def _build_view(self) -> MigView:
        """The MIG GPUs with the partitions bound and assumed pods hold (tessera.kube.mig)."""
        caches, pods, assumed = self.parts.caches, self.parts.pods, self.parts.inflight.mig
        gpus = {n: ni.mig for n, ni in caches.nodes.items.items() if ni.mig}
        if not gpus:
            return MigView()
        holds = [(p.node, p.mig_hold, f"{p.namespace}/{p.name}") for p in pods.values()
                 if p.node and p.mig_hold is not None and not p.finished]
        # mig.tessera.io claims hold the placement of their allocation, whoever allocated it
        # (made by the kubelet plugin at prepare, or still to be made); as no pod's: evicting
        # a pod does not free a claim's partition until the claim is deallocated and
        # unprepared, which the cycle cannot follow, so it is never a MIG victim.
        allocated: set[PodKey] = set()
        for key, claim in caches.resource_claims.items.items():
            for node, index, profile, start in dra.mig_allocations(claim):
                uuid_ = next((g.uuid for g in gpus.get(node, ()) if g.index == index), None)
                if uuid_ is not None:
                    holds.append((node, MigHold(uuid_, profile, start), ""))
                    allocated.add(key)
        for key in [k for k in assumed
                    if (p := pods.get(k)) is not None and p.node and p.mig_claim
                    and all((p.namespace, n) in allocated for n in p.claim_names)]:
            del assumed[key]  # the claim's allocation holds it now
        mine = [(a.node, a.hold, f"{key[0]}/{key[1]}") for key, a in assumed.items()]
        view = MigView.build(gpus, [*holds, *mine])
        view.serving_nodes = frozenset(n for n in view.nodes if self._serves_shares(n))
        return view

    def _serves_shares(self, node: str) -> bool:
        """Whether the operator let this node's MIG GPUs serve shares (its label
        ``tessera.io/mig-serves-shares``); a value that is neither true nor false is said in
        the log, once per value, and taken as false."""
        ni = self.parts.caches.nodes.items.get(node)
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

    def _serve_shares(self) -> Overlay:
        """Shares that waited for room on the shared GPUs are placed this cycle as pods of the
        smallest profile that holds them, on the nodes that serve shares only, while one of
        those has room for it; else they stay shares. Recomputed each cycle, as room comes
        and goes."""
        view, overlay = self.view, {}
        models = sorted({g.model for n in view.serving_nodes for g in view.nodes.get(n, ())})
        for key, share in list(self.serving.items()):
            pod = self.parts.pods.below(self.name, key)
            if pod is None or pod.node or pod.request is None or not (
                    pod.mig_served or servable(pod)):
                del self.serving[key]
                continue
            fits = sorted({p for m in models if (p := serving_profile(share, m)) is not None},
                          key=lambda p: (p.slots, p.compute, p.name))
            profile = next((p for p in fits if view.serving_nodes & set(view.room(p.name)[0])),
                           None)
            if profile is not None:
                overlay[key] = {"request": dataclasses.replace(
                    pod.request, gpu=GpuRequest.none(), gpus=profile.fraction),
                    "mig_profile": profile.name, "mig_served": True}
            else:
                overlay[key] = {"request": dataclasses.replace(pod.request, gpu=share,
                                                               gpus=None),
                                "mig_profile": None, "mig_served": False}
        return overlay

    def after_derive(self) -> None:
        """A bound MIG pod whose slot a partition tessera did not make has taken since the
        bind (an operator's, made behind the scheduler's back) can never get its partition:
        it is evicted, so its controller's new pod is placed again, instead of waiting bound
        for ever (tessera.kube.mig.blocked)."""
        if not self.view.nodes:
            return  # no GPU in MIG mode: nothing to look at in this cycle's pods
        nodes, evicting = self.parts.caches.nodes.items, self.parts.inflight.evicting
        for pod in list(self.parts.pods.values()):
            hold = pod.mig_hold
            info = nodes.get(pod.node or "")
            if hold is None or pod.finished or info is None or not info.mig \
                    or pod.key in evicting:
                continue
            taken = blocked(info.mig, hold)
            if taken is None:
                continue
            evicting.add(pod.key)
            metrics.EVICTIONS.labels("MIGSlotTaken").inc()
            self.parts.spawn(self.parts.writer.evict(pod, "MIGSlotTaken", (
                f"its MIG {hold.profile} at memory slot {hold.start} of GPU {hold.gpu} cannot be "
                f"made: a {taken.profile} partition tessera did not make now sits at memory slot "
                f"{taken.start}; evicted so it is placed again")))

    def reserve(self, pod: PodInfo, binding: PodBinding, victims: list[PodKey]) -> bool:
        """The GPU and slot of a MIG pod's partition on the node the cycle chose: the cycle's
        choice (``binding.mig``, over the same view, with its victims' partitions idle), else
        ``choose`` now (an idle one of the profile, else the slot that fragments least, else
        after removing idle ones). False: taken by another pod of this cycle (the next cycle
        looks again)."""
        if pod.mig_profile is None:
            return True
        node, chosen = binding.placement.node, binding.mig
        self.view.release(node, (f"{k[0]}/{k[1]}" for k in victims))
        gpus = self.view.nodes.get(node)
        choice = chosen if gpus and chosen is not None and any(
            g.key == chosen.gpu for g in gpus) else choose(gpus, pod.mig_profile) if gpus else None
        if gpus is None or choice is None:
            return False
        self.parts.inflight.mig[pod.key] = MigAssumed(
            node, apply_choice(gpus, pod.mig_profile, choice))
        return True

    def waiting(self, key: PodKey, pod: PodInfo, kind: str) -> None:
        if (kind in SERVABLE_WAITS and self.view.serving_nodes and not pod.mig_served
                and servable(pod)):
            assert pod.request is not None
            self.serving[key] = pod.request.gpu

    def forget(self, key: PodKey) -> None:
        self.serving.pop(key, None)

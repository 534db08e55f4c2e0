"""Cleaning up half-done work, every ~2 s and once at start: reservation pods with no tenants,
ConfigMaps whose pod is gone or unbound (and not being bound), what each hook collects, shared
pods whose reservation pod vanished, and gangs left below their minimum
(tessera.kube.stale_gangs)."""

from __future__ import annotations

import logging

from lightkube import ApiError
from lightkube.resources.core_v1 import Pod

from tessera.kube.hooks import CycleHook
from tessera.kube.objects import PodInfo
from tessera.kube.parts import Parts
from tessera.kube.reservations import Reservations
from tessera.kube.stale_gangs import StaleGangs

log = logging.getLogger("tessera.kube")


class Janitor:
    def __init__(self, parts: Parts, hooks: list[CycleHook]) -> None:
        self.parts = parts
        self.hooks = hooks
        self.checking: set[tuple[str, str]] = set()
        """ConfigMaps whose pod the API server is being asked about before they are deleted."""
        self.stale = StaleGangs(parts.opts.stale_gang_seconds)

    async def run(self) -> None:
        parts, inflight = self.parts, self.parts.inflight
        for key in inflight.prune(parts.caches.pods.items.__contains__):
            log.warning("pod %s/%s was still counted as being evicted after it was gone", *key)
        parts.reservations.release_unused(
            Reservations.tenants(parts.pods.values(), inflight.assumed), parts.spawn)
        for (ns, name), cm in list(parts.caches.configmaps.items.items()):
            if cm.pod is None or (ns, name) in self.checking:
                continue
            pod = parts.pods.get((ns, cm.pod))
            if pod is None or (not pod.node and (ns, cm.pod) not in inflight.assumed
                               and (ns, cm.pod) not in inflight.tasks):
                self.checking.add((ns, name))
                parts.spawn(self._drop_configmap(ns, name, cm.pod))
        for hook in self.hooks:
            hook.collect()
        for pod in list(parts.pods.values()):
            if (pod.reservation is not None or not pod.node or pod.placement is None
                    or pod.placement.exclusive or pod.finished or pod.key in inflight.evicting
                    or pod.claim_names):
                continue
            missing = parts.reservations.missing(pod.node, pod.placement.devices)
            if missing and pod.node in parts.caches.nodes.items:
                inflight.evicting.add(pod.key)
                parts.spawn(parts.writer.evict(
                    pod, "GPUReservationLost",
                    f"the reservation pod holding its GPU on {pod.node} (device {missing[0]}) "
                    "disappeared, so the GPU may be given to another pod"))
        self._stale_gangs()

    def _stale_gangs(self) -> None:
        parts, inflight = self.parts, self.parts.inflight

        def placed(pod: PodInfo) -> bool:
            # Bound only: a member whose binding is being retried must not restart the grace
            # (its members pass the gang barrier together, so a gang being bound is not below).
            return bool(pod.node)

        for pod, why in self.stale.evictions(parts.pods.values(), parts.caches.pod_groups.items,
                                             placed):
            if pod.key not in inflight.evicting:
                inflight.evicting.add(pod.key)
                parts.spawn(parts.writer.evict(pod, "StaleGang", why))

    async def _drop_configmap(self, ns: str, name: str, pod_name: str) -> None:
        """Deletes a pod's ConfigMap once the API server itself says the pod is gone or unbound:
        the cache can lag (a watch reconnecting after an outage), and a binding whose answer was
        lost (the API server died after committing it) has bound the pod although the bind
        call failed; deleting on the cache's word left such a pod bound with no ConfigMap."""
        parts = self.parts
        try:
            try:
                live = await parts.client.get(Pod, pod_name, namespace=ns)
            except ApiError as exc:
                if exc.status.code != 404:
                    return
                live = None
            if live is not None and live.spec is not None and live.spec.nodeName:
                return
            await parts.writer.delete_configmap(ns, name)
            parts.caches.configmaps.items.pop((ns, name), None)
        except Exception as exc:  # the API server unreachable: judged again next time
            log.info("ConfigMap %s/%s kept for now: %r", ns, name, exc)
        finally:
            self.checking.discard((ns, name))

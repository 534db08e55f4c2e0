"""The extension point of a cycle: what a hook may do, each with a do-nothing default.

Modelled on kube-scheduler's framework (PreFilter / Reserve / Unreserve) and KAI's plugins'
session callbacks, sized to what tessera's features need. The loop (tessera.kube.scheduler)
calls every registered hook (tessera.kube.hooks.cycle_hooks) at each point, in order:

1. ``derive``: before the snapshot, the PodInfo fields this hook changes for this cycle (an
   overlay laid by ``PodView``; the informer's cache is never written);
2. ``after_derive``: with all overlays laid (e.g. evict what can never run);
3. ``partners``: while evictions are applied, the pods that must go with an evicted one;
4. ``reserve``: before a binding starts, whether it may (and take what it needs);
5. ``waiting``: for each pod the plan leaves waiting (its wait kind);
6. ``silent``: whether the reason a pod waits is written on it now;
7. ``collect``: from the janitor, every ~2 s: delete or release what nothing uses;
8. ``forget``: the pod is gone (through the in-flight ledger).
"""

from __future__ import annotations

from tessera.core.cycle import PodBinding
from tessera.kube.objects import PodInfo, PodKey
from tessera.kube.parts import Parts
from tessera.kube.podview import Overlay


class CycleHook:
    name = "hook"

    def __init__(self, parts: Parts) -> None:
        self.parts = parts

    def derive(self) -> Overlay:
        """Pod key -> the fields changed this cycle; read what lies below through
        ``self.parts.pods.below(self.name, key)``."""
        return {}

    def after_derive(self) -> None:
        pass

    def partners(self, key: PodKey) -> list[PodKey]:
        return []

    def reserve(self, pod: PodInfo, binding: PodBinding, victims: list[PodKey]) -> bool:
        return True

    def waiting(self, key: PodKey, pod: PodInfo, kind: str) -> None:
        pass

    def silent(self, key: PodKey) -> bool:
        return False

    def collect(self) -> None:
        pass

    def forget(self, key: PodKey) -> None:
        pass

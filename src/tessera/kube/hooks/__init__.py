"""Per-cycle hooks (tessera.kube.hooks.base.CycleHook): one file each, registered below.

A feature that changes what the cycle sees (a pod's request derived from other objects, a
partition to choose before binding, objects to collect) is a new hook file plus one line in
``cycle_hooks``; the loop (tessera.kube.scheduler) does not change. Order matters: a hook's
overlay is laid over the earlier hooks' (tessera.kube.podview).
"""

from __future__ import annotations

from tessera.kube.hooks.base import CycleHook
from tessera.kube.hooks.claims import ClaimHook
from tessera.kube.hooks.mig import MigHook
from tessera.kube.parts import Parts


def cycle_hooks(parts: Parts) -> list[CycleHook]:
    return [
        ClaimHook(parts),  # DRA ResourceClaims: the request a pod's claims make
        MigHook(parts),    # MIG: the partitions held, shares a partition serves
    ]


__all__ = ["ClaimHook", "CycleHook", "MigHook", "cycle_hooks"]

"""Bind steps (tessera.kube.bind.base.BindStep): one file each, registered below, run in order.

A feature that gives a pod something at bind (a reservation, a partition, a claim allocation,
environment for its container) is a new step file plus one line in ``bind_steps``; the binder
(tessera.kube.bind.binder) and the loop do not change.
"""

from __future__ import annotations

from tessera.kube.bind.base import Abandon, BindContext, BindStep
from tessera.kube.bind.claim_allocation import ClaimAllocation
from tessera.kube.bind.configmap import ConfigMapWrite
from tessera.kube.bind.devices_free import DevicesFree
from tessera.kube.bind.mig_partition import MigPartition
from tessera.kube.bind.reservation_share import ReservationShare
from tessera.kube.bind.served_share import ServedShare
from tessera.kube.hooks.mig import MigHook
from tessera.kube.parts import Parts


def bind_steps(parts: Parts, mig: MigHook) -> list[BindStep]:
    return [
        DevicesFree(parts),          # whole GPUs: bound once the pods holding them are gone
        MigPartition(parts, mig),    # the partition chosen at reserve, in the ConfigMap
        ServedShare(parts, mig),     # a share a partition serves: its limits
        ReservationShare(parts),     # a shared GPU: the reservation pod and its UUID
        ConfigMapWrite(parts),       # the container's environment, before the binding
        ClaimAllocation(parts),      # DRA: each claim's allocation and reservedFor
    ]


__all__ = ["Abandon", "BindContext", "BindStep", "bind_steps"]

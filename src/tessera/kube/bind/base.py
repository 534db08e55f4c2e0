"""The extension point of a binding: a bind step (KAI's binder plugins: PreBind / Rollback).

A binding (tessera.kube.bind.binder) runs every registered step whose ``applies`` says yes, in
order, then binds the pod with the annotations they gathered. A step may raise (the binding
fails: back-off, one FailedBinding Event per distinct error) or raise ``Abandon`` (the pod went
away or was bound meanwhile: nothing to do). When a binding fails, the steps that ran are
rolled back in reverse order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera.core.state import Placement
from tessera.kube.inflight import MigAssumed
from tessera.kube.objects import PodInfo, PodKey


class Abandon(Exception):
    """The pod went away or was bound while its binding was being prepared."""


@dataclass
class BindContext:
    key: PodKey
    placement: Placement
    pod: PodInfo
    """The pod as last read (a step that waits reads it again)."""
    annotations: dict[str, str] = field(default_factory=dict)
    """Written on the pod in the binding's request."""
    configmap: dict[str, str] | None = None
    """The pod's ConfigMap data (its container's environment), written before the binding."""
    partition: MigAssumed | None = None
    """The MIG partition this pod is bound with (tessera.kube.bind.mig_partition)."""
    how: str = ""
    """Said after the node in the Scheduled Event, e.g. " (served by MIG 1g.5gb ...)"."""


class BindStep:
    name = "step"

    def applies(self, ctx: BindContext) -> bool:
        return True

    async def pre_bind(self, ctx: BindContext) -> None:
        """Do what must be done before the binding; add to ``ctx``."""

    def rollback(self, ctx: BindContext) -> None:
        """The binding failed after this step ran: undo what is not collected otherwise."""

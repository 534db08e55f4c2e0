"""The cycle's actions. Each is a small unit with a ``name`` and ``execute(session)``."""

from __future__ import annotations

from typing import Protocol

from tessera.core.cycle.session import Session

from .allocate import Allocate, Backfill
from .consolidate import Consolidate
from .preempt import Preempt
from .reclaim import Reclaim
from .shrink import Shrink


class Action(Protocol):
    name: str

    def execute(self, session: Session) -> None: ...


ACTIONS: dict[str, type[Action]] = {
    a.name: a for a in (Allocate, Consolidate, Shrink, Reclaim, Preempt, Backfill)
}

__all__ = ["ACTIONS", "Action", "Allocate", "Backfill", "Consolidate", "Preempt", "Reclaim", "Shrink"]

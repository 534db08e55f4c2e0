"""State kept beside an object the cycle keeps (a warm session, a cluster state).

Several passes remember what they worked out between warm cycles (reclaim's rooms and victim
facts, the running index, the devices' kinds). Each store is tied to the object its state
describes and held weakly, so it goes when that object goes: a cold cycle's session leaves
nothing behind, and a kept session carries its stores to the next cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar
from weakref import WeakKeyDictionary

K = TypeVar("K")
T = TypeVar("T")


class KeptWith(Generic[K, T]):
    """One store per key object, made by ``make`` on first use."""

    def __init__(self, make: Callable[[K], T]) -> None:
        self._make = make
        self._kept: WeakKeyDictionary[K, T] = WeakKeyDictionary()

    def get(self, key: K) -> T | None:
        """The store of ``key`` if one was made (none is made here)."""
        return self._kept.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._kept

    def __call__(self, key: K) -> T:
        kept = self._kept.get(key)
        if kept is None:
            kept = self._kept[key] = self._make(key)
        return kept

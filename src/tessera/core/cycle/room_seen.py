"""The memo entry of reclaim's "would every victim left on this node make room" test
(``tessera.core.cycle.victims._room_with``), by name rather than by tuple position."""

from __future__ import annotations

from typing import NamedTuple


class RoomSeen(NamedTuple):
    """What a node would have free with a set of victims gone, and each request's answer."""

    sig: object
    """The node state's signature object when this was worked out (renewed on every change)."""
    victims: tuple[int, ...]
    free: list[int]
    tenants: list[int]
    cpu: int
    mem: int
    compute: list[int]
    answers: dict[int, bool]
    """Per ``NodeIndex.request_id``."""

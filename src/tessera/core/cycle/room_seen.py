"""The memo entry of reclaim's "would the request fit on this node with every victim gone"
test (``tessera.core.cycle.victims.NodeIndex.no_room_even_empty``), by name rather than by
tuple position."""

from __future__ import annotations

from typing import NamedTuple

from tessera.core.model import ResourceRequest


class RoomSeen(NamedTuple):
    """What a node would have free with every victim gone, and each request's answer."""

    sig: object
    """The node state's signature object when this was worked out (renewed on every change)."""
    free: list[int]
    tenants: list[int]
    cpu: int
    mem: int
    compute: list[int]
    answers: dict[ResourceRequest, bool]

"""The one writer of tessera-node's Kubernetes Events: every sync step and the observer (escapes,
reclaims) post through it. The body is :func:`tessera.wire.event_body`, the same builder the
scheduler and the API server use.

An Event is posted once per (object, reason, message): the same problem seen at every sync is
not posted again. What was posted is remembered in bounded memory (the last ``POSTED_MAX``,
least recently seen dropped first) and forgotten per object when its problem is fixed
(:meth:`EventPoster.forget`), so a problem that recurs after a fix is said again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any

from lightkube import codecs

from tessera import wire

log = logging.getLogger("tessera.node")

COMPONENT = "tessera-node"
POSTED_MAX = 4096


class EventPoster:
    def __init__(self, client: Any, node_name: str, limit: int = POSTED_MAX) -> None:
        self.client = client
        self.node_name = node_name
        self.limit = limit
        self.posted: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        """Events posted (object, reason, message), not posted again; the last ``limit``."""
        self._tasks: set[asyncio.Task[None]] = set()

    async def post(self, namespace: str, name: str, uid: str, kind: str, reason: str,
                   message: str, warning: bool = True) -> None:
        dedup = (uid or name, reason, message)
        if dedup in self.posted:
            self.posted.move_to_end(dedup)
            return
        self.posted[dedup] = None
        while len(self.posted) > self.limit:
            self.posted.popitem(last=False)
        obj = codecs.from_dict(wire.event_body(
            kind=kind, name=name, namespace=namespace, uid=uid, reason=reason, message=message,
            type_="Warning" if warning else "Normal", component=COMPONENT,
            instance=self.node_name, host=self.node_name))
        try:
            await self.client.create(obj)
        except Exception as exc:
            log.warning("event %s on %s/%s: %r", reason, namespace, name, exc)
            self.posted.pop(dedup, None)

    async def pod(self, namespace: str, name: str, uid: str, reason: str, message: str,
                  warning: bool = True) -> None:
        await self.post(namespace, name, uid, "Pod", reason, message, warning)

    def post_soon(self, namespace: str, name: str, uid: str, kind: str, reason: str,
                  message: str, warning: bool = True) -> None:
        """From synchronous code on the agent's loop (the observer's sink)."""
        task = asyncio.get_running_loop().create_task(
            self.post(namespace, name, uid, kind, reason, message, warning))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def forget(self, uid: str) -> None:
        """The object's problems are fixed: if one recurs, it is posted again."""
        for seen in [k for k in self.posted if k[0] == uid]:
            del self.posted[seen]

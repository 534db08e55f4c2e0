"""The scheduler's first request: its system namespace exists (made if missing)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time

from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace

from tessera.kube.retry import is_transient, status_code

log = logging.getLogger("tessera.kube")


async def ensure_namespace(client: AsyncClient, namespace: str,
                           forbidden_for: float = 60.0) -> None:
    """Waits (jittered backoff up to 5 s) while the API server cannot be reached or answers
    5xx, so a scheduler started during a control-plane outage waits for it instead of exiting
    into a crash loop's growing back-off. A 403 is retried for ``forbidden_for`` seconds (an
    API server that has just started refuses requests until its RBAC caches are filled), then
    raised: missing rules are not waited for forever."""
    forbidden_until: float | None = None
    delay = 0.2
    while True:
        try:
            try:
                await client.get(Namespace, namespace)
            except ApiError as exc:
                if exc.status.code != 404:
                    raise
                with contextlib.suppress(ApiError):  # the release namespace exists
                    await client.create(Namespace(metadata=ObjectMeta(name=namespace)))
            return
        except Exception as exc:
            if status_code(exc) == 403:
                forbidden_until = forbidden_until or time.monotonic() + forbidden_for
                if time.monotonic() > forbidden_until:
                    raise
            elif not is_transient(exc):
                raise
            log.warning("waiting for the API server: %s; retrying in %.1f s", exc, delay)
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(5.0, delay * 2)

"""Retries with exponential backoff for conflicts (409), throttling (429) and transient errors."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx2
from lightkube import ApiError

from tessera.kube import metrics

log = logging.getLogger(__name__)
T = TypeVar("T")

TRANSIENT_CODES = frozenset({409, 429, 500, 502, 503, 504})


def status_code(exc: BaseException) -> int | None:
    from tessera.kube.rawapi import KubeHTTPError

    if isinstance(exc, ApiError):
        return int(exc.status.code or 0)
    if isinstance(exc, KubeHTTPError):
        return exc.code
    return None


def is_transient(exc: BaseException) -> bool:
    code = status_code(exc)
    if code is not None:
        return code in TRANSIENT_CODES
    return isinstance(exc, httpx2.TransportError | httpx2.TimeoutException | OSError
                      | asyncio.IncompleteReadError)


async def with_backoff(
    what: str,
    op: Callable[[], Awaitable[T]],
    *,
    attempts: int = 8,
    base: float = 0.05,
    cap: float = 2.0,
    retry_on: Callable[[BaseException], bool] = is_transient,
) -> T:
    """Run ``op`` until it succeeds; retry what ``retry_on`` accepts with jittered backoff.

    ``op`` re-reads what it needs on every attempt (a 409 means its view was stale)."""
    delay = base
    for attempt in range(1, attempts + 1):
        try:
            return await op()
        except Exception as exc:
            if attempt == attempts or not retry_on(exc):
                raise
            log.info("%s: attempt %d failed (%s); retrying in %.2fs", what, attempt, exc, delay)
            metrics.RETRIES.inc()
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(cap, delay * 2)
    raise AssertionError("unreachable")

"""The scheduler's probe endpoint: ``/healthz`` over plain HTTP (uvicorn, the webhook's server),
and its Prometheus metrics at ``/metrics`` (:data:`tessera.kube.metrics.SCHEDULER`).

Liveness means the scheduler's event loop answers: the endpoint runs on the same loop as the
informers and the cycle, so a loop blocked for longer than the probe's timeout fails the probe
and the kubelet restarts the container. Replicas waiting for the leader Lease are healthy too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

Scope = dict[str, Any]


class HealthApp:
    """ASGI app: ``GET /healthz`` -> 200 ``ok``; ``GET /metrics``; anything else 404."""

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] == "GET" and scope["path"] == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            from tessera.kube.metrics import SCHEDULER

            text = generate_latest(SCHEDULER)
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", CONTENT_TYPE_LATEST.encode()),
                                    (b"content-length", str(len(text)).encode())]})
            await send({"type": "http.response.body", "body": text})
            return
        ok = scope["method"] == "GET" and scope["path"] in ("/healthz", "/readyz")
        body = b"ok" if ok else b"not found"
        await send({"type": "http.response.start", "status": 200 if ok else 404,
                    "headers": [(b"content-type", b"text/plain"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def start_health_server(host: str, port: int) -> asyncio.Task[None]:
    """Serve HealthApp on host:port in the running loop; cancel the task to stop it."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # the scheduler handles SIGTERM/SIGINT itself

    server = Server(uvicorn.Config(HealthApp(), host=host, port=port, log_level="warning",
                                   access_log=False, lifespan="off"))
    return asyncio.create_task(server.serve())

"""The web console at ``/``, ``GET /metrics`` and the routes the console reads
(``/api/v1/overview``, ``/api/v1/metrics/history``), added to the REST API for both backends.

The console is a small single-page app: plain HTML, CSS and JavaScript shipped inside this
package (``static/``), with one vendored library (uPlot, MIT, for the time-series charts). It
calls the same REST API as the CLI with the same bearer token (its login page takes a token or
the client credentials), so it needs no server-side session and behaves the same on both
backends. Nothing is loaded from the internet at run time.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from tessera.api.backend import Backend
from tessera.api.history import History
from tessera.api.prometheus import api_registry
from tessera.api.prometheus_history import PrometheusHistory
from tessera.api.telemetry import SnapshotCache
from tessera.api.tenancy.visibility import redact_history, redact_overview

STATIC = Path(__file__).parent / "static"
ASSET = re.compile(r'"/console/([^"?]+)"')


def versioned_index() -> str:
    """index.html with each of its assets named with its version (``?v=`` its size and
    modification time): the browser keeps an asset until it changes and asks nothing for it
    meanwhile (VersionedStatic), so a page load costs one request for index.html, not one per
    asset (about 0.4 s of a GPUs page's first 0.6 s on a loaded machine, tessera.bench.console)."""
    def version(m: re.Match[str]) -> str:
        try:
            st = (STATIC / m.group(1)).stat()
        except OSError:
            return m.group(0)
        return f'"/console/{m.group(1)}?v={st.st_mtime_ns:x}{st.st_size:x}"'
    return ASSET.sub(version, (STATIC / "index.html").read_text())


class VersionedStatic(StaticFiles):
    """The console's assets; asked for by version (``?v=``), cached by the browser for a year."""

    def file_response(self, full_path: Any, stat_result: os.stat_result, scope: Any,
                      status_code: int = 200) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        if b"v=" in scope.get("query_string", b""):
            response.headers["Cache-Control"] = "public, max-age=31536000, immutable"
        return response


def mount_console(app: FastAPI, api: APIRouter, backend: Backend,
                  collectors: Sequence[Collector] = (),
                  visible: Callable[[Request], frozenset[str] | None] = lambda _: None,
                  ) -> History:
    """Adds the console, ``/metrics`` and the console's API routes (``api``: the authorized
    ``/api/v1`` router, before it is included), and starts the history's sampler (a daemon
    thread)."""
    snapshots = SnapshotCache(backend)
    data_dir = getattr(backend, "data_dir", None)  # both backends keep one: history survives
    history = History(snapshots, path=None if data_dir is None else Path(data_dir)
                      / "metrics-history.jsonl").start()
    prometheus = os.environ.get("TESSERA_PROMETHEUS_URL", "")
    source = PrometheusHistory(prometheus, history) if prometheus else history
    registry = api_registry(snapshots)
    for collector in getattr(backend, "metrics_collectors", list)():
        registry.register(collector)  # a backend's own (embedded: per-workload GPU time)
    for collector in collectors:  # more families for /metrics (GPU accounting)
        registry.register(collector)
    app.mount("/console", VersionedStatic(directory=STATIC), name="console")

    @app.get("/", include_in_schema=False)
    def index() -> Response:
        return Response(versioned_index(), media_type="text/html",
                        headers={"Cache-Control": "no-cache"})

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> FileResponse:  # an SVG: browsers take it by its media type
        return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml",
                            headers={"Cache-Control": "max-age=86400"})

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @api.get("/overview", tags=["console"])
    def overview(request: Request) -> dict[str, Any]:
        """GPUs allocated, free and loaned; workloads by phase; each project against its fair
        share (``state``: over, at or under): the projects the caller may read."""
        return redact_overview(snapshots.get().overview(), visible(request))

    @api.get("/metrics/history", tags=["console"])
    def metrics_history(
        request: Request,
        minutes: Annotated[float, Query(gt=0, le=24 * 60)] = 60,
    ) -> dict[str, Any]:
        """Samples the server kept (every ``interval`` seconds) over the last ``minutes``, one
        list per series: GPUs allocated in all, per project and per active workload; under
        ``utilization``, GPUs' worth of utilisation in all, per project and per workload (from
        the node agents; ``null`` where no agent reported); under ``memoryUsed``, GPU memory
        used per project (bytes). With ``TESSERA_PROMETHEUS_URL`` set, the same series come
        from that Prometheus (``source: prometheus``; docs/console.md)."""
        return redact_history(source.document(time.time() - minutes * 60), visible(request))

    return history

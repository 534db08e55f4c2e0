"""What the agent tells the API server about its GPUs: ``GET /usage`` beside ``GET /metrics``.

The API server's console shows, per GPU, the memory in use against what is allocated and the
memory each dynamic fraction holds above its request (a loan), and charts utilisation per
workload. It learns them from each node's agent: the agent publishes where it serves them on its
Node once (``tessera.io/node-agent-url``, :mod:`tessera.node.publish`) and the API server polls
``/usage`` (:mod:`tessera.kube.agent_usage`). JSON rather than the Prometheus text, so that 500
nodes cost the API server a ``json.loads`` each instead of a text parse. Embedded mode builds the
same document in the server's process (:mod:`tessera.local.usage`).

Document (all memory in bytes, utilisation 0 to 1, ``null`` where NVML gives none)::

    {"node": "gpu-node-0", "time": 1764000000.0, "ready": true, "message": "",
     "gpus": [{"uuid", "memoryTotalBytes", "memoryUsedBytes", "utilization"}],
     "shares": [{"namespace", "pod", "workload", "project", "gpuUuid", "requestBytes",
                 "limitBytes", "chargedBytes", "usedBytes", "loanedBytes", "smUtilization",
                 and, for a compute share, "gpuTime1s", "gpuTime10s", "gpuSecondsTotal",
                 "computeRequest", "computeLimit", "computeEnforced"}]}

``gpus`` is ``null`` when the agent has no usage to give (no NVML): ``message`` says why.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from tessera.node.usage import NodeUsage


def _ratio(percent: int | None) -> float | None:
    return None if percent is None else round(min(100, max(0, percent)) / 100, 4)


ShareFields = dict[tuple[str, str, str], dict[str, Any]]
"""More fields for shares, by (GPU UUID, namespace, pod): a sync step's (the compute share's GPU
time: gpuTime1s, gpuTime10s, gpuSecondsTotal, computeRequest, computeLimit, computeEnforced)."""


def usage_document(node: str, usage: NodeUsage | None, ready: bool, message: str = "",
                   now: float | None = None, extra: ShareFields | None = None) -> dict[str, Any]:
    """The ``/usage`` document of one node from the agent's latest picture; ``extra`` adds
    fields to the shares it names (and a share of its own where NVML shows none)."""
    doc: dict[str, Any] = {"node": node, "time": time.time() if now is None else now,
                           "ready": ready, "message": message, "gpus": None, "shares": []}
    if usage is None:
        doc["message"] = message or "no GPU usage read yet (NVML not open)"
        return doc
    doc["gpus"] = [{"uuid": g.uuid, "memoryTotalBytes": g.memory_total,
                    "memoryUsedBytes": g.memory_used, "utilization": _ratio(g.utilization)}
                   for g in usage.gpus]
    doc["shares"] = [{"namespace": v.share.namespace, "pod": v.share.pod,
                      "workload": v.share.workload, "project": v.share.project,
                      "gpuUuid": v.gpu_uuid, "requestBytes": v.request_bytes,
                      "limitBytes": v.limit_bytes, "chargedBytes": v.charged_bytes,
                      "usedBytes": v.nvml_bytes, "loanedBytes": v.loaned_bytes,
                      "smUtilization": _ratio(v.sm_util)} for v in usage.shares]
    _add_fields(doc["shares"], extra or {})
    return doc


def _add_fields(shares: list[dict[str, Any]], extra: ShareFields) -> None:
    left = dict(extra)
    for sh in shares:
        more = left.pop((sh["gpuUuid"], sh["namespace"], sh["pod"]), None)
        if more:
            sh.update(more)
    for (uuid, namespace, pod), more in sorted(left.items()):
        shares.append({"namespace": namespace, "pod": pod, "gpuUuid": uuid, **more})


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """A scrape every few seconds is not news."""


def start_server(port: int, address: str, registry: CollectorRegistry,
                 document: Callable[[], dict[str, Any]]) -> tuple[Any, threading.Thread]:
    """Serves ``/usage`` (``document()`` as JSON) and, on every other path, the Prometheus
    registry (what ``prometheus_client.start_http_server`` serves), from a daemon thread."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/usage":
            body = json.dumps(document(), separators=(",", ":")).encode()
            start_response("200 OK", [("Content-Type", "application/json"),
                                      ("Content-Length", str(len(body)))])
            return [body]
        return metrics(environ, start_response)  # type: ignore[no-any-return]

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in address else socket.AF_INET

    httpd = make_server(address, port, app, Server, handler_class=_Quiet)
    thread = threading.Thread(target=httpd.serve_forever, name="tessera-node-http", daemon=True)
    thread.start()
    return httpd, thread


def advertised_url(explicit: str, address: str, port: int, pod_ip: str) -> str:
    """Where the API server reaches ``/usage``: ``--advertise-url`` as given, else the metrics
    address when it is a specific one, else the pod's IP (downward API ``POD_IP``); empty when
    none is known (nothing is published: the console says the node's agent gave no address)."""
    if explicit:
        return explicit.rstrip("/")
    host = address if address not in ("", "0.0.0.0", "::") else pod_ip
    if not host:
        return ""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"

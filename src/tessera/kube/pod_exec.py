"""Run a command in a pod's container through the API server's ``pods/exec`` (non-interactive).

lightkube has no exec, so this speaks the Kubernetes exec protocol itself: an HTTP/1.1 upgrade
to WebSocket with subprotocol ``v4.channel.k8s.io`` on the client's own connection (same TLS
and credentials), then binary frames whose first byte is the channel: 1 stdout, 2 stderr,
3 the final ``Status`` (exit code in ``details.causes[ExitCode]``).

When the API server cannot reach the node's kubelet (kwok nodes have none) it answers the
upgrade request with a ``Status`` error instead; that is raised as ``ExecError``.
"""

from __future__ import annotations

import base64
import json
import os
import time
from typing import Any

MAX_OUTPUT = 4 * 2**20


class ExecError(Exception):
    """``status``: the HTTP status when the API server refused the upgrade; None when the
    failure came later (from the kubelet, over the stream)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _http(client: Any) -> Any:
    """The HTTP client inside a lightkube ``Client`` (base URL, TLS and auth of the kubeconfig;
    httpx, or httpx2 in lightkube 1.x, which has the same API)."""
    inner = getattr(client, "_client", None)
    hx = getattr(inner, "_client", None)
    if not callable(getattr(hx, "stream", None)):
        raise ExecError("this lightkube client has no HTTP client to upgrade")
    return hx


def _exit_code(status: dict[str, Any]) -> int:
    if status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            return int(cause.get("message", 1))
    raise ExecError(str(status.get("message") or status))


def pod_exec(client: Any, namespace: str, pod: str, container: str, command: list[str],
             timeout: float = 60.0) -> dict[str, Any]:
    """``{exitCode, stdout, stderr}`` of COMMAND run in the container (output capped at 4 MiB)."""
    from wsproto.connection import Connection, ConnectionType
    from wsproto.events import BytesMessage, CloseConnection, Message, Ping

    hx = _http(client)
    params: list[tuple[str, str | int | float | bool | None]] = [("command", c) for c in command]
    params += [("container", container), ("stdout", "true"), ("stderr", "true")]
    headers = {
        "Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
        "Sec-WebSocket-Protocol": "v4.channel.k8s.io",
    }
    url = f"/api/v1/namespaces/{namespace}/pods/{pod}/exec"
    out = {1: bytearray(), 2: bytearray()}
    status: dict[str, Any] | None = None
    with hx.stream("GET", url, params=params, headers=headers, timeout=timeout) as r:
        if r.status_code != 101:
            body = r.read()
            try:
                message = json.loads(body).get("message") or body.decode(errors="replace")
            except ValueError:
                message = body.decode(errors="replace") or f"HTTP {r.status_code}"
            raise ExecError(str(message), r.status_code)
        stream = r.extensions["network_stream"]
        ws = Connection(ConnectionType.CLIENT)
        deadline = time.monotonic() + timeout
        buffered = bytearray()
        done = False
        while not done:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ExecError(f"the command did not finish within {timeout:g} s")
            data = stream.read(65536, timeout=left)
            if not data:
                break
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, Message):
                    buffered += event.data if isinstance(event, BytesMessage) else \
                        event.data.encode()
                    if not event.message_finished:
                        continue
                    channel, payload = buffered[0], bytes(buffered[1:])
                    buffered = bytearray()
                    if channel in out and len(out[channel]) < MAX_OUTPUT:
                        out[channel] += payload
                    elif channel == 3 and payload:
                        status = json.loads(payload)
                elif isinstance(event, Ping):
                    stream.write(ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    done = True
    if status is None:
        raise ExecError("the connection closed before the command's exit status arrived")
    return {"exitCode": _exit_code(status), "stdout": out[1].decode(errors="replace"),
            "stderr": out[2].decode(errors="replace")}

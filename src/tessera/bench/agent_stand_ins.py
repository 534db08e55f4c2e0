"""Stand-ins for the node agents of hundreds of kwok nodes (tessera.bench.console,
tessera.bench.console_page): one HTTP server in a child process answering each node's
``/NODE/usage`` with a document built by the agent's own code
(:func:`tessera.node.report.usage_document`); 500 agent processes do not fit a small machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _stand_in_docs(uuids: dict[str, list[str]]) -> dict[str, bytes]:
    """``/NODE/usage`` -> each node's document: its 8 GPUs in use, built by the agent's code."""
    from tessera.node.nvml import GpuUsage
    from tessera.node.report import usage_document
    from tessera.node.usage import NodeUsage

    docs: dict[str, bytes] = {}
    for node, ids in uuids.items():
        gpus = tuple(GpuUsage(u, i, 80 * 2**30, (i + 1) * 2**30, 10 * i) for i, u in enumerate(ids))
        docs[f"/{node}/usage"] = json.dumps(usage_document(node, NodeUsage(gpus, {}, (), ()),
                                                           True)).encode()
    return docs


def serve_stand_ins(uuids_file: str) -> None:
    """The stand-in agents, in a process of their own (so they take no CPU from the process
    that times the requests): prints the base URL, serves until killed."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    docs = _stand_in_docs(json.loads(Path(uuids_file).read_text()))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = docs.get(self.path)
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"http://127.0.0.1:{server.server_port}", flush=True)
    server.serve_forever()


class AgentStandIns:
    """``GET /NODE/usage`` for every node (:func:`serve_stand_ins` in a child process)."""

    def __init__(self, uuids: dict[str, list[str]], workdir: Path) -> None:
        import subprocess
        import sys

        path = workdir / "stand-in-uuids.json"
        path.write_text(json.dumps(uuids))
        self.docs = _stand_in_docs(uuids)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from tessera.bench.agent_stand_ins import "
             f"serve_stand_ins; serve_stand_ins({str(path)!r})"],
            stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url:
            raise RuntimeError("the stand-in agents did not start")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()

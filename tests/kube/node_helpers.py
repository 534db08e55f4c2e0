"""tessera-node in the test cluster: a node of its own for a module and its agent, a pod's
Events, the programs a pod's process runs copied where any UID can read them, a pod process
running cuprobe."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lightkube import Client
from lightkube.resources.core_v1 import Event, Node

from tessera.testing.cluster import TestCluster


@contextlib.contextmanager
def own_node(cluster: TestCluster, client: Client, model: str, prefix: str) -> Iterator[Any]:
    """One single-GPU node ``{prefix}0`` of ``model`` for a module, its agent while the block
    runs; the Node is deleted after (a module fixture's body)."""
    from tessera.testing.gpu_nodes import NodeShape

    cluster.create_gpu_nodes(1, NodeShape(gpus=1, model=model), prefix=prefix)
    try:
        yield agent_of(cluster, f"{prefix}0")
    finally:
        with contextlib.suppress(Exception):
            client.delete(Node, f"{prefix}0")


@contextlib.contextmanager
def readable_copy(agent: Any, program: str, writable: tuple[str, ...] = ()) -> Iterator[Path]:
    """``program`` (a native test program), the agent's isolation library and the fake driver
    copied where any UID can read them (the build cache lies under /root), as ``base/program``,
    ``base/libtessera-cuda.so`` and ``base/fake/``; the folders named in ``writable`` are
    made and open to all. Removed after."""
    from tessera.isolation.build import ensure_built

    native = ensure_built()
    base = Path(tempfile.mkdtemp(prefix=f"tessera-pod-{program}-"))
    try:
        for d in ("fake", *writable):
            (base / d).mkdir()
        shutil.copy(native.program(program), base / program)
        shutil.copy(agent.library_dir / "libtessera-cuda.so", base / "libtessera-cuda.so")
        for name in ("libcuda.so.1", "libnvidia-ml.so.1"):
            shutil.copy(Path(native.fake_dir) / name, base / "fake" / name)
        for p in [base, *base.rglob("*")]:
            os.chmod(p, 0o777 if p.name in writable else 0o755)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def agent_of(cluster: TestCluster, node: str) -> Any:
    for group in cluster.node_agents:
        if node in group.agents:
            return group.agents[node]
    raise AssertionError(f"no tessera-node for {node}")


def events(client: Client, ns: str, name: str) -> list[Event]:
    return [e for e in client.list(Event, namespace=ns)
            if e.involvedObject.name == name]


class Process:
    """One pod process running cuprobe: a command, its one-line answer."""

    def __init__(self, popen: Any) -> None:
        self.popen = popen

    def send(self, line: str) -> None:
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def answer(self, timeout: float = 20.0) -> str:
        import select

        ready, _, _ = select.select([self.popen.stdout], [], [], timeout)
        assert ready, "no answer from the pod's process"
        return str(self.popen.stdout.readline().strip())

    def __call__(self, line: str) -> str:
        self.send(line)
        return self.answer()

"""tessera-node in the test cluster: the agent of a node, a pod's Events, a pod process running
cuprobe."""

from __future__ import annotations

from typing import Any

from lightkube import Client
from lightkube.resources.core_v1 import Event

from tessera.testing.cluster import TestCluster


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

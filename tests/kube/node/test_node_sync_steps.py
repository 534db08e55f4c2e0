"""tessera-node's sync steps (tessera.node.sync): the loop runs what is registered, in order;
a failed sync makes every step forget what it wrote; every step file is registered; Events are
posted once per problem, again after a fix, and what was posted is remembered in bounded memory.
Events go to the test cluster's real API server."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Event

import tessera.node.sync as sync_package
from tessera import wire
from tessera.node.agent import AgentOptions, KubeAgent
from tessera.node.agent_options import PodView
from tessera.node.events import EventPoster
from tessera.node.sync import STEPS, NodeContext, SyncStep
from tessera.node.sync.share_files import ShareFiles
from tessera.testing.cluster import TestCluster

ORDER: list[str] = []


class First(SyncStep):
    name = "first"

    def __init__(self) -> None:
        self.reset = 0

    async def sync(self, node: NodeContext) -> None:
        ORDER.append(self.name)

    def failed(self) -> None:
        self.reset += 1


class Second(First):
    name = "second"


class Broken(First):
    name = "broken"

    async def sync(self, node: NodeContext) -> None:
        ORDER.append(self.name)
        raise OSError("the disk is gone")


def test_the_loop_runs_the_registered_steps_in_order_and_resets_them_after_a_failure() -> None:
    ORDER.clear()
    agent = KubeAgent(AgentOptions(node_name="n"), client=None, nvml=None,  # type: ignore[arg-type]
                      steps=(First, Second))
    asyncio.run(agent.sync())
    assert ORDER == ["first", "second"] and agent.syncs == 1
    assert [s.reset for s in agent.steps] == [0, 0]  # type: ignore[attr-defined]
    ORDER.clear()
    agent = KubeAgent(AgentOptions(node_name="n"), client=None, nvml=None,  # type: ignore[arg-type]
                      steps=(First, Broken, Second))
    asyncio.run(agent.sync())
    assert ORDER == ["first", "broken"] and agent.syncs == 0  # the sync stops at the error
    assert [s.reset for s in agent.steps] == [1, 1, 1]  # type: ignore[attr-defined]


def test_every_sync_step_file_is_registered_once() -> None:
    found = set()
    for info in pkgutil.iter_modules(sync_package.__path__):
        module = importlib.import_module(f"{sync_package.__name__}.{info.name}")
        found |= {c for _, c in inspect.getmembers(module, inspect.isclass)
                  if issubclass(c, SyncStep) and c is not SyncStep
                  and c.__module__ == module.__name__}
    assert found == set(STEPS) and len(STEPS) == len(set(STEPS))
    assert len({s.name for s in STEPS}) == len(STEPS)


@pytest.fixture
def client(kube_cluster: TestCluster) -> Iterator[Any]:
    yield kube_cluster.async_client()


def _events(client: Client, ns: str, name: str, reason: str) -> list[Event]:
    return [e for e in client.list(Event, namespace=ns)
            if e.involvedObject.name == name and e.reason == reason]


def test_an_event_is_posted_once_again_after_a_fix_and_memory_is_bounded(
        client: Any, kube_client: Client, kube_namespace: str) -> None:
    ns = kube_namespace
    events = EventPoster(client, "node-a", limit=2)

    async def post(name: str, message: str = "broken") -> None:
        await events.pod(ns, name, f"uid-{name}", "GPUIsolationFailed", message)

    async def scenario() -> None:
        await post("a")
        await post("a")  # the same problem at the next sync: not posted again
        assert len(_events(kube_client, ns, "a", "GPUIsolationFailed")) == 1
        events.forget("uid-a")  # fixed; it recurs
        await post("a")
        assert len(_events(kube_client, ns, "a", "GPUIsolationFailed")) == 2
        await post("b")
        await post("c")  # the limit is 2: a's entry is the least recently seen, dropped
        assert len(events.posted) == 2 and ("uid-a", "GPUIsolationFailed", "broken") \
            not in events.posted
        await post("a")
        assert len(_events(kube_client, ns, "a", "GPUIsolationFailed")) == 3
    asyncio.run(scenario())
    (event,) = _events(kube_client, ns, "b", "GPUIsolationFailed")
    assert event.type == "Warning" and event.source.component == "tessera-node" \
        and event.source.host == "node-a" and event.involvedObject.uid == "uid-b"


def test_share_file_errors_of_pods_that_are_gone_are_forgotten(
        client: Any, kube_client: Client, kube_namespace: str, tmp_path: Path) -> None:
    ns = kube_namespace
    opts = AgentOptions(node_name="node-a", containers_dir=tmp_path, containers_host_dir=tmp_path)
    node = NodeContext(opts, client, EventPoster(client, "node-a"), nvml=None, listed=True)
    bad = PodView(ns, "bad", "uid-bad", {wire.GPU_CONFIG_KEY: "0123456789abcdef",
                                         wire.PLACEMENT: "{not json"}, {}, [], deleting=False)
    node.pods = {(ns, "bad"): bad}
    step = ShareFiles()
    asyncio.run(step.sync(node))
    assert list(step.errors) == ["uid-bad"] and node.shares == {}
    (event,) = _events(kube_client, ns, "bad", "GPUIsolationFailed")
    assert wire.PLACEMENT in event.message
    node.pods = {}
    asyncio.run(step.sync(node))
    assert step.errors == {}


def test_an_urgent_step_runs_at_once_not_behind_a_slow_sync() -> None:
    """A pod a step marks urgent (a reservation pod waiting for its GPU UUID) is acted on while a
    slow sync is still running, and only by the urgent step; an urgent step that fails is reset
    and the loop goes on."""
    ran: list[tuple[str, float]] = []

    class Slow(SyncStep):
        name = "slow"

        async def sync(self, node: NodeContext) -> None:
            await asyncio.sleep(2.0)
            ran.append((self.name, asyncio.get_running_loop().time()))

    class Uuids(SyncStep):
        name = "uuids"

        def __init__(self) -> None:
            self.reset = 0

        def urgent(self, pod: PodView) -> bool:
            return pod.labels.get("wants") == "now"

        async def sync(self, node: NodeContext) -> None:
            ran.append((self.name, asyncio.get_running_loop().time()))
            if len(ran) == 1:
                raise OSError("first try fails")

        def failed(self) -> None:
            self.reset += 1

    async def scenario() -> None:
        agent = KubeAgent(AgentOptions(node_name="n"), client=None, nvml=None,  # type: ignore[arg-type]
                          steps=(Slow, Uuids))
        t0 = asyncio.get_running_loop().time()
        urgent = asyncio.create_task(agent.run_urgent())
        sync = asyncio.create_task(agent.sync())
        await asyncio.sleep(0.1)
        pod = PodView(namespace="ns", name="res", uid="u", labels={"wants": "now"},
                      annotations={}, volumes=[], deleting=False)
        agent.node.pods[("ns", "res")] = pod
        agent.urgent.set()
        await asyncio.sleep(0.1)
        agent.urgent.set()  # seen again: runs again after the failure
        await asyncio.sleep(0.1)
        assert [n for n, _ in ran] == ["uuids", "uuids"]  # while the slow sync still runs
        assert all(t - t0 < 1.0 for _, t in ran)
        assert agent.steps[1].reset == 1  # type: ignore[attr-defined]
        agent.node.pods.clear()  # nothing urgent left: the event alone runs no step
        agent.urgent.set()
        await asyncio.sleep(0.1)
        assert len(ran) == 2
        await sync
        urgent.cancel()
        assert [n for n, _ in ran] == ["uuids", "uuids", "slow", "uuids"]

    asyncio.run(scenario())

"""tessera-node on Kubernetes: one agent per node (the chart's DaemonSet).

The agent watches the pods bound to its node and, every ``--sync-interval`` seconds and at once
after one of them changes, runs the sync steps of :data:`tessera.node.sync.STEPS` in order (one
file each under ``node/sync/``: MIG modes and partitions, the Node's annotations, the
ResourceSlices, reservation pods' GPU UUIDs, share files, usage/metrics/escapes/reclaimer).
Before the first sync it prepares the node (:mod:`tessera.node.readiness`). Events go through
one :class:`~tessera.node.events.EventPoster`.

Restart safety: the agent keeps no state of its own. On start it lists the pods on its node,
finishes or undoes a half-done library install, rewrites every share's files (unchanged files
are left alone) and removes the directories of pods that are gone. It never kills a process for
a pod that no longer exists: decisions are made from the picture of this sync only.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import logging
from pathlib import Path

from lightkube import AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Pod

from tessera.node.agent_options import AgentOptions, PodView, pod_view
from tessera.node.containers import Share
from tessera.node.draplugin.cdi import PluginConfig
from tessera.node.events import COMPONENT, EventPoster
from tessera.node.metrics import NodeCollector
from tessera.node.nvml import Nvml
from tessera.node.observe import Observer
from tessera.node.plugins import NodePlugin
from tessera.node.readiness import prepare
from tessera.node.sync import STEPS, NodeContext, SyncStep
from tessera.node.sync.slices import plugin_config

__all__ = ["AgentOptions", "KubeAgent", "PodView", "load_plugin", "make_client", "pod_view"]

log = logging.getLogger("tessera.node")


def load_plugin(options: dict[str, str]) -> NodePlugin | None:
    """The loan reclaimer, when this build has one (``tessera.node.reclaim``)."""
    if importlib.util.find_spec("tessera.node.reclaim") is None:
        return None
    module = importlib.import_module("tessera.node.reclaim")
    factory = getattr(module, "make_reclaimer", None)
    return factory(options) if factory is not None else None


class KubeAgent:
    def __init__(self, opts: AgentOptions, client: AsyncClient, nvml: Nvml | None,
                 nvml_error: str = "", plugin: NodePlugin | None = None,
                 steps: tuple[type[SyncStep], ...] = STEPS) -> None:
        self.opts = opts
        self.client = client
        self.events = EventPoster(client, opts.node_name)
        self.node = NodeContext(opts, client, self.events, nvml, nvml_error)
        self.observer = Observer(opts.node_name, nvml, None, opts.containers_dir, opts.on_escape,
                                 self._sink, opts.escape_tolerance, plugin)
        self.node.observer = self.observer
        self.steps = [step() for step in steps]
        self.wake = asyncio.Event()
        self.urgent = asyncio.Event()
        """A pod some step must act on now (SyncStep.urgent): :meth:`run_urgent` runs them."""
        self.syncs = 0

    @property
    def collector(self) -> NodeCollector:
        return self.observer.collector

    @property
    def ready(self) -> bool:
        return self.node.ready

    @property
    def reason(self) -> str:
        return self.node.reason

    def prepare(self) -> None:
        prepare(self.node)

    def plugin_config(self, cdi_dir: Path) -> PluginConfig:
        return plugin_config(self.node, cdi_dir)

    def _sink(self, share: Share | None, reason: str, message: str, warning: bool) -> None:
        """The observer's Events (escapes, reclaims): on the share's pod, else on the Node."""
        if share is None:
            self.events.post_soon("", self.opts.node_name, "", "Node", reason, message, warning)
        else:
            self.events.post_soon(share.namespace, share.pod, share.uid, "Pod", reason, message,
                                  warning)

    # ---- the pods on this node ------------------------------------------------------------------
    async def _list_pods(self) -> None:
        pods: dict[tuple[str, str], PodView] = {}
        async for pod in self.client.list(Pod, namespace="*",
                                          fields={"spec.nodeName": self.opts.node_name}):
            v = pod_view(pod)
            pods[(v.namespace, v.name)] = v
        self.node.pods = pods
        self.node.listed = True

    async def watch_pods(self) -> None:
        while True:
            try:
                await self._list_pods()
                self.wake.set()
                async for kind, pod in self.client.watch(
                        Pod, namespace="*", fields={"spec.nodeName": self.opts.node_name}):
                    v = pod_view(pod)
                    if kind == "DELETED":
                        self.node.pods.pop((v.namespace, v.name), None)
                    else:
                        self.node.pods[(v.namespace, v.name)] = v
                        if any(step.urgent(v) for step in self.steps):
                            self.urgent.set()
                    self.wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("pod watch: %r; relisting", exc)
                await asyncio.sleep(0.5)

    # ---- the loop -------------------------------------------------------------------------------
    async def run_urgent(self) -> None:
        """The steps a pod just seen needs at once, alone, each time one is (e.g. a reservation
        pod's GPU UUID, which the scheduler waits for); their place in the sync stays."""
        while True:
            await self.urgent.wait()
            self.urgent.clear()
            for step in [s for s in self.steps if any(s.urgent(p) for p in self.node.pods.values())]:
                try:
                    await step.sync(self.node)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("%s (urgent): %r", step.name, exc)
                    step.failed()

    async def sync_once(self) -> None:
        for step in self.steps:
            await step.sync(self.node)
        self.syncs += 1

    async def sync(self) -> None:
        """One sync; an error stops it (logged), and every step forgets what it last wrote."""
        try:
            await self.sync_once()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("sync failed: %r", exc)
            for step in self.steps:
                step.failed()

    async def run(self) -> None:
        self.prepare()
        self.collector.ready = self.ready
        if self.node.nvml is None:
            print(f"tessera-node: {self.node.nvml_error}; node {self.opts.node_name} is not ready "
                  "for GPU shares (metrics are still served)", flush=True)
        watcher = asyncio.create_task(self.watch_pods())
        urgent = asyncio.create_task(self.run_urgent())
        try:
            while True:
                await self.sync()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), self.opts.sync_interval)
                self.wake.clear()
        finally:
            watcher.cancel()
            urgent.cancel()


def make_client(kubeconfig: str | None) -> AsyncClient:
    config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    return AsyncClient(config, timeout=None, field_manager=COMPONENT)

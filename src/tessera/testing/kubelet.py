"""A test double of the kubelet's device side for kwok nodes: device assignment + pod-resources.

kwok plays the kubelet's pod life cycle but runs no device plugin and serves no pod-resources
API. This process does both, for a set of simulated nodes: for every pod bound to one of them
whose containers ask for ``nvidia.com/gpu`` (reservation pods and whole-GPU pods), it assigns
free devices of that node (the device plugin's job; device IDs are GPU UUIDs, the NVIDIA plugin's
default ``deviceIDStrategy: uuid``) and serves the real kubelet pod-resources v1 gRPC API
(``List``, ``GetAllocatableResources``) on ``DIR/NODE/kubelet.sock``, answering from those
assignments. tessera-node then learns each reservation pod's GPU exactly as on a real node.
It also registers each node's DRA plugin as the kubelet's plugin watcher does
(``DIR/NODE/plugins_registry``, :mod:`tessera.testing.plugin_watcher`).

    python -m tessera.testing.kubelet --kubeconfig P --dir D --devices devices.json

``devices.json``: ``{"node-name": ["GPU-...", ...], ...}`` (the UUIDs of the node's fake NVML
devices, in index order); without it, every node labelled ``tessera.io/simulated=true`` with its
``tessera.io/gpu-uuids`` annotation. Restart: assignments are rebuilt from the reservation pods'
``tessera.io/gpu-uuid`` annotations before anything new is assigned.

``--play-agents`` (benchmarks with hundreds of nodes, where one tessera-node process per node
does not fit on one machine): no sockets; the double also does the two things the scheduler
waits for from tessera-node, marking each node ready (reason ``simulated``) and writing each
reservation pod's assigned UUID as ``tessera.io/gpu-uuid``. Nothing else of the agent (NVML,
isolation files, metrics) is simulated. Tests and ``cluster up`` run the real agents.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from lightkube import AsyncClient, KubeConfig
from lightkube.operators import not_equal
from lightkube.resources.core_v1 import Pod

from tessera.node.podresources import api_pb2, api_pb2_grpc

GPU_RESOURCE = "nvidia.com/gpu"
GPU_UUID = "tessera.io/gpu-uuid"
log = logging.getLogger("tessera.testing.kubelet")


@dataclass
class PodGpus:
    namespace: str
    name: str
    uid: str
    containers: list[tuple[str, int]]
    """(container, whole GPUs it asks for)."""
    hint: str | None = None
    """A UUID it already holds (reservation pods' annotation), used first on restart."""


@dataclass
class NodeDevices:
    uuids: list[str]
    pods: dict[str, PodGpus] = field(default_factory=dict)
    """uid -> pod."""
    assigned: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    """uid -> container -> device ids."""

    def taken(self) -> set[str]:
        return {d for per in self.assigned.values() for ids in per.values() for d in ids}

    def assign(self, pod: PodGpus) -> None:
        if pod.uid in self.assigned:
            return
        free = [u for u in self.uuids if u not in self.taken()]
        if pod.hint and pod.hint in free:
            free.remove(pod.hint)
            free.insert(0, pod.hint)
        need = sum(n for _, n in pod.containers)
        if need > len(free):
            log.warning("pod %s/%s asks for %d GPU(s), %d free: not assigned (a kubelet would "
                        "refuse it with UnexpectedAdmissionError)", pod.namespace, pod.name,
                        need, len(free))
            return
        per: dict[str, list[str]] = {}
        for container, n in pod.containers:
            per[container], free = free[:n], free[n:]
        self.assigned[pod.uid] = per
        log.info("%s/%s: %s", pod.namespace, pod.name, per)

    def release(self, uid: str) -> None:
        self.pods.pop(uid, None)
        self.assigned.pop(uid, None)


def gpu_pod(obj: Any) -> PodGpus | None:
    d = obj.to_dict() if hasattr(obj, "to_dict") else obj
    meta, spec = d.get("metadata") or {}, d.get("spec") or {}
    containers: list[tuple[str, int]] = []
    for c in spec.get("containers") or []:
        n = ((c.get("resources") or {}).get("limits") or {}).get(GPU_RESOURCE)
        if n is not None and int(str(n)) > 0:
            containers.append((c["name"], int(str(n))))
    if not containers:
        return None
    return PodGpus(namespace=meta.get("namespace", ""), name=meta.get("name", ""),
                   uid=meta.get("uid", ""), containers=containers,
                   hint=(meta.get("annotations") or {}).get(GPU_UUID))


class Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, node: NodeDevices) -> None:
        self.node = node

    async def List(self, request: Any, context: Any) -> Any:
        pods = []
        for uid, per in self.node.assigned.items():
            pod = self.node.pods.get(uid)
            if pod is None:
                continue
            pods.append(api_pb2.PodResources(
                name=pod.name, namespace=pod.namespace,
                containers=[api_pb2.ContainerResources(
                    name=c, devices=[api_pb2.ContainerDevices(resource_name=GPU_RESOURCE,
                                                              device_ids=ids)])
                    for c, ids in per.items()]))
        return api_pb2.ListPodResourcesResponse(pod_resources=pods)

    async def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        return api_pb2.AllocatableResourcesResponse(devices=[
            api_pb2.ContainerDevices(resource_name=GPU_RESOURCE, device_ids=[u])
            for u in self.node.uuids])


class KubeletDouble:
    def __init__(self, client: AsyncClient, directory: Path, devices: dict[str, list[str]],
                 play_agents: bool = False) -> None:
        self.client = client
        self.directory = directory
        self.nodes = {name: NodeDevices(list(uuids)) for name, uuids in devices.items()}
        self.servers: list[Any] = []
        self.play_agents = play_agents
        self.to_annotate: asyncio.Queue[tuple[str, str, str]] = asyncio.Queue()
        self.annotated: set[str] = set()

    def socket(self, node: str) -> Path:
        return self.directory / node / "kubelet.sock"

    async def serve(self) -> None:
        for name, node in self.nodes.items():
            sock = self.socket(name)
            sock.parent.mkdir(parents=True, exist_ok=True)
            sock.unlink(missing_ok=True)
            server = grpc.aio.server()
            api_pb2_grpc.add_PodResourcesListerServicer_to_server(  # type: ignore[no-untyped-call]
                Lister(node), server)
            server.add_insecure_port(f"unix://{sock}")
            await server.start()
            self.servers.append(server)

    def _seen(self, kind: str, obj: Any) -> None:
        d = obj.to_dict()
        node_name = (d.get("spec") or {}).get("nodeName")
        node = self.nodes.get(node_name or "")
        uid = (d.get("metadata") or {}).get("uid", "")
        if node is None:
            return
        if kind == "DELETED":
            node.release(uid)
            return
        pod = gpu_pod(d)
        if pod is None:
            return
        node.pods[uid] = pod
        node.assign(pod)
        labels = (d.get("metadata") or {}).get("labels") or {}
        if (self.play_agents and uid in node.assigned and not pod.hint
                and labels.get("tessera.io/gpu-reservation") == "true" and uid not in self.annotated):
            self.annotated.add(uid)
            first = next(iter(node.assigned[uid].values()))[0]
            self.to_annotate.put_nowait((pod.namespace, pod.name, first))

    async def annotate(self) -> None:
        """--play-agents: what tessera-node would write for reservation pods."""
        from lightkube.types import PatchType

        while True:
            namespace, name, uuid = await self.to_annotate.get()
            try:
                await self.client.patch(Pod, name, {"metadata": {"annotations": {GPU_UUID: uuid}}},
                                        namespace=namespace, patch_type=PatchType.MERGE)
            except Exception as exc:
                log.warning("annotating %s/%s: %r", namespace, name, exc)

    async def mark_ready(self) -> None:
        from lightkube.resources.core_v1 import Node
        from lightkube.types import PatchType

        todo = iter(self.nodes)

        async def worker() -> None:  # 16 at a time: one by one took minutes at 2,000 nodes
            for name in todo:
                await self.client.patch(Node, name, {"metadata": {"annotations": {
                    "tessera.io/node-ready": "true",
                    "tessera.io/node-ready-reason": ""}}}, patch_type=PatchType.MERGE)

        await asyncio.gather(*(worker() for _ in range(16)))

    async def watch(self) -> None:
        while True:
            try:
                # Adopt first (restart): pods already holding a GPU keep it.
                # Only bound pods (what a kubelet is sent): unbound ones hold nothing here.
                bound: dict[str, Any] = {"spec.nodeName": not_equal("")}
                pods = [p async for p in self.client.list(Pod, namespace="*", fields=bound)]
                pods.sort(key=lambda p: 0 if (p.metadata and p.metadata.annotations
                                              and GPU_UUID in p.metadata.annotations) else 1)
                for p in pods:
                    self._seen("ADDED", p)
                async for kind, pod in self.client.watch(Pod, namespace="*", fields=bound):
                    self._seen(kind, pod)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("pod watch: %r", exc)
                await asyncio.sleep(0.5)

    async def run(self) -> None:
        tasks = []
        if self.play_agents:
            await self.mark_ready()
            tasks = [asyncio.create_task(self.annotate()) for _ in range(16)]
            print(f"kubelet double playing the agents of {len(self.nodes)} node(s)", flush=True)
        else:
            await self.serve()
            print(f"kubelet double serving pod-resources for {len(self.nodes)} node(s) under "
                  f"{self.directory}", flush=True)
        try:
            await self.watch()
        finally:
            for task in tasks:
                task.cancel()
            for s in self.servers:
                await s.stop(0)


async def _simulated_nodes(client: AsyncClient) -> dict[str, list[str]]:
    from lightkube.resources.core_v1 import Node

    out: dict[str, list[str]] = {}
    async for node in client.list(Node, labels={"tessera.io/simulated": "true"}):
        meta = node.metadata
        if meta is None or meta.name is None:
            continue
        raw = (meta.annotations or {}).get("tessera.io/gpu-uuids", "")
        out[meta.name] = [u for u in raw.split(",") if u]
    return out


async def _main(args: argparse.Namespace) -> None:
    client = AsyncClient(KubeConfig.from_file(args.kubeconfig), timeout=None)
    devices = (json.loads(Path(args.devices).read_text()) if args.devices
               else await _simulated_nodes(client))
    double = KubeletDouble(client, Path(args.dir), devices, play_agents=args.play_agents)

    async def run() -> None:
        if args.play_agents:
            await double.run()
            return
        # the kubelet's plugin watcher, per node (tessera.testing.plugin_watcher)
        from tessera.testing import plugin_watcher

        dirs = [Path(args.dir) / node / "plugins_registry" for node in devices]
        await asyncio.gather(double.run(), plugin_watcher.watch(dirs))

    task = asyncio.create_task(run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tessera.testing.kubelet")
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--dir", default=".", help="sockets go to DIR/NODE/kubelet.sock")
    p.add_argument("--devices", default=None,
                   help="JSON file: node -> GPU UUIDs (default: every simulated node)")
    p.add_argument("--play-agents", action="store_true",
                   help="benchmarks only: also write node readiness and reservation pods' UUIDs")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Simulated GPU status writer for kwok nodes (what the node agent does on a real node).

On a real node the GPU a reservation pod holds is chosen by the NVIDIA device plugin, and the
node agent learns its UUID (kubelet pod-resources API or NVML) and writes it on the pod as
``tessera.io/gpu-uuid``. kwok has no device plugin, so this process plays both: for every
reservation pod bound to a simulated node (``tessera.io/simulated=true``) it picks a GPU of
that node that no other reservation pod on the node holds, from the node's
``tessera.io/gpu-uuids`` annotation, and writes its UUID on the pod.

    python -m tessera.testing.gpu_status --kubeconfig PATH [--namespace tessera-system]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys

from lightkube import AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Node, Pod

from tessera.kube.rawapi import KubeHTTPError, RawApi
from tessera.testing.gpu_nodes import GPU_UUIDS_ANNOTATION, SIMULATED_LABEL

RESERVATION_LABEL = "tessera.io/gpu-reservation"
GPU_UUID = "tessera.io/gpu-uuid"

log = logging.getLogger("tessera.testing.gpu_status")


class GpuStatusWriter:
    def __init__(self, client: AsyncClient, namespace: str = "tessera-system") -> None:
        self.client = client
        self.raw = RawApi(client.config, connections=16)
        self.namespace = namespace
        self.node_uuids: dict[str, list[str]] = {}
        self.held: dict[str, dict[str, str]] = {}
        """node -> pod name -> uuid (reservation pods that have one)."""
        self.pending: dict[str, set[str]] = {}
        self.queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self.written = 0

    async def _nodes(self) -> None:
        while True:
            try:
                async for kind, node in self.client.watch(Node, labels={SIMULATED_LABEL: "true"}):
                    assert node.metadata is not None and node.metadata.name is not None
                    name = node.metadata.name
                    if kind == "DELETED":
                        self.node_uuids.pop(name, None)
                        continue
                    raw = (node.metadata.annotations or {}).get(GPU_UUIDS_ANNOTATION, "")
                    self.node_uuids[name] = [u for u in raw.split(",") if u]
                    for pod in list(self.pending.get(name, ())):
                        self.queue.put_nowait((name, pod))
            except Exception as exc:
                log.warning("node watch: %r", exc)
                await asyncio.sleep(0.5)

    async def _pods(self) -> None:
        while True:
            try:
                async for kind, pod in self.client.watch(
                    Pod, namespace=self.namespace, labels={RESERVATION_LABEL: "true"}
                ):
                    assert pod.metadata is not None and pod.metadata.name is not None
                    name = pod.metadata.name
                    node = pod.spec.nodeName if pod.spec else None
                    if not node:
                        continue
                    uuid = (pod.metadata.annotations or {}).get(GPU_UUID)
                    held = self.held.setdefault(node, {})
                    if kind == "DELETED":
                        held.pop(name, None)
                        self.pending.get(node, set()).discard(name)
                        continue
                    if uuid:
                        held[name] = uuid
                        self.pending.get(node, set()).discard(name)
                    elif pod.metadata.deletionTimestamp is None:
                        self.pending.setdefault(node, set()).add(name)
                        self.queue.put_nowait((node, name))
            except Exception as exc:
                log.warning("pod watch: %r", exc)
                await asyncio.sleep(0.5)

    async def _writer(self) -> None:
        while True:
            node, name = await self.queue.get()
            held = self.held.setdefault(node, {})
            if name not in self.pending.get(node, set()) or node not in self.node_uuids or name in held:
                continue
            taken = set(held.values())
            free = [u for u in self.node_uuids[node] if u not in taken]
            if not free:
                log.warning("node %s: no free GPU for reservation pod %s", node, name)
                continue
            held[name] = free[0]
            try:
                await self.raw.request(
                    "PATCH", f"/api/v1/namespaces/{self.namespace}/pods/{name}",
                    {"metadata": {"annotations": {GPU_UUID: free[0]}}},
                    content_type="application/merge-patch+json")
                self.pending[node].discard(name)
                self.written += 1
            except KubeHTTPError as exc:
                held.pop(name, None)
                if exc.code != 404:
                    log.warning("annotating %s: %s", name, exc)
                    await asyncio.sleep(0.2)
                    self.queue.put_nowait((node, name))

    async def run(self) -> None:
        tasks = [asyncio.create_task(c) for c in
                 (self._nodes(), self._pods(), *(self._writer() for _ in range(16)))]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()


async def _main(kubeconfig: str, namespace: str) -> None:
    client = AsyncClient(KubeConfig.from_file(kubeconfig), timeout=None)
    writer = GpuStatusWriter(client, namespace)
    task = asyncio.create_task(writer.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    print("gpu status writer running", flush=True)
    with contextlib.suppress(asyncio.CancelledError):
        await task


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.testing.gpu_status")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", default="tessera-system")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    asyncio.run(_main(args.kubeconfig, args.namespace))
    return 0


if __name__ == "__main__":
    sys.exit(main())

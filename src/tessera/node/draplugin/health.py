"""DRAResourceHealth/NodeWatchResources for gpu.tessera.io: the health of this node's devices,
streamed to the kubelet (which puts it into a pod's ``status.containerStatuses[].
allocatedResourcesStatus``).

Kubelet 1.36 has ResourceHealthStatus on and opens this stream on every DRA plugin; a plugin
without it answers Unimplemented, which the kubelet logs and retries every 5 s for as long as
the plugin runs. tessera answers with one message per period listing every GPU of the pool
(``gpu-<index>``, as in the ResourceSlice): HEALTHY while the agent can enforce shares on it,
UNHEALTHY with the reason while it cannot (the node is not ready for shares), and each message
says how long it stays valid (``health_check_timeout_seconds``: three periods), so a silent
agent turns into Unknown at the kubelet rather than into a stale Healthy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from tessera.node.draplugin import health_pb2, health_pb2_grpc
from tessera.node.draplugin.cdi import PluginConfig

PERIOD_S = 30.0


def snapshot(cfg: PluginConfig) -> Any:
    """One NodeWatchResourcesResponse for the node as ``cfg`` describes it now."""
    now = int(time.time())
    status = health_pb2.UNHEALTHY if cfg.not_ready else health_pb2.HEALTHY
    message = f"tessera-node cannot enforce shares: {cfg.not_ready}"[:1024] if cfg.not_ready \
        else ""
    return health_pb2.NodeWatchResourcesResponse(devices=[
        health_pb2.DeviceHealth(
            device=health_pb2.DeviceIdentifier(pool_name=cfg.node, device_name=f"gpu-{i}"),
            health=status, last_updated_time=now,
            health_check_timeout_seconds=int(3 * PERIOD_S), message=message)
        for i in sorted(cfg.uuids)])


class DraHealth(health_pb2_grpc.DRAResourceHealthServicer):
    def __init__(self, config: Callable[[], PluginConfig], period: float = PERIOD_S,
                 stopping: threading.Event | None = None) -> None:
        self.config = config
        self.period = period
        self.stopping = stopping or threading.Event()

    def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:
        last: Any = None
        sent_at = 0.0
        while context.is_active() and not self.stopping.is_set():
            now = self.snapshot_now()
            changed = last is None or [(d.health, d.message) for d in now.devices] != [
                (d.health, d.message) for d in last.devices]
            if changed or time.monotonic() - sent_at >= self.period:
                yield now
                last, sent_at = now, time.monotonic()
            self.stopping.wait(min(1.0, self.period))

    def snapshot_now(self) -> Any:
        return snapshot(self.config())

"""The kubelet's calls a real kubelet 1.36 makes on tessera's DRA plugin that kwok never did
(found by the real-node feasibility run, issue 27): the DRAResourceHealth stream, the
registration the ResourceSlice waits for, and the pod-resources reply with DRA devices. Each over
the real gRPC sockets with the kubelet's own protos (k8s.io/kubelet v0.36.3)."""

from __future__ import annotations

import tempfile
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from tessera.node.draplugin import health_pb2, health_pb2_grpc
from tessera.node.draplugin.cdi import PluginConfig
from tessera.node.draplugin.plugin import serve
from tessera.node.draplugin.service import DraPaths, DraService
from tessera.node.podresources import api_pb2, api_pb2_grpc
from tessera.node.podresources.client import list_claim_devices
from tessera.testing import plugin_watcher


def _sockets() -> tuple[Path, Path]:
    d = Path(tempfile.mkdtemp(prefix="tdra-"))  # unix socket paths must be short
    return d / "plugins" / "dra.sock", d / "registry" / "gpu.tessera.io-reg.sock"


def test_node_watch_resources_streams_every_gpus_health_and_its_changes() -> None:
    state: dict[str, Any] = {"not_ready": ""}

    def cfg() -> PluginConfig:
        return PluginConfig(node="node-a", uuids={0: "GPU-a", 1: "GPU-b"},
                            cdi_dir=Path("/cdi"), library_dir=Path("/lib"),
                            not_ready=state["not_ready"])

    plugin, reg = _sockets()
    server, _ = serve(cfg, lambda ns, n: {}, plugin, reg)
    try:
        with grpc.insecure_channel(f"unix://{plugin}") as ch:
            stream = health_pb2_grpc.DRAResourceHealthStub(ch).NodeWatchResources(  # type: ignore[no-untyped-call]
                health_pb2.NodeWatchResourcesRequest(), timeout=20)
            first = next(stream)
            assert [(d.device.pool_name, d.device.device_name, d.health)
                    for d in first.devices] == [("node-a", "gpu-0", health_pb2.HEALTHY),
                                                ("node-a", "gpu-1", health_pb2.HEALTHY)]
            assert all(d.health_check_timeout_seconds > 0 and d.last_updated_time > 0
                       for d in first.devices)
            state["not_ready"] = "the isolation library is not installed"
            second = next(stream)
            assert {d.health for d in second.devices} == {health_pb2.UNHEALTHY}
            assert "the isolation library is not installed" in second.devices[0].message
            stream.cancel()
    finally:
        server.stop(None)


def test_the_slice_waits_for_the_kubelets_registration() -> None:
    """DraService.registered (what the agent's slice waits for) turns true only once the
    kubelet's plugin watcher (here its double, doing what the kubelet does) has called GetInfo
    and NotifyRegistrationStatus on the registration socket."""
    plugin, reg = _sockets()
    paths = DraPaths(reg.parent, plugin.parent, Path("/cdi"))
    service = DraService(paths, client=None, config=lambda: PluginConfig(  # type: ignore[arg-type]
        node="n", uuids={0: "GPU-a"}, cdi_dir=Path("/cdi"), library_dir=Path("/lib")))
    service.start()
    try:
        assert not service.registered()
        assert plugin_watcher.register(paths.registration_socket) == "gpu.tessera.io"
        assert service.registered()
    finally:
        service.stop()


class _Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    """What the real kubelet answered for the DRA pod of the feasibility run."""

    def List(self, request: Any, context: Any) -> Any:
        return api_pb2.ListPodResourcesResponse(pod_resources=[api_pb2.PodResources(
            name="dra-pod", namespace="team-a", containers=[api_pb2.ContainerResources(
                name="main", dynamic_resources=[api_pb2.DynamicResource(
                    claim_name="quarter", claim_namespace="team-a",
                    claim_resources=[api_pb2.ClaimResource(
                        cdi_devices=[api_pb2.CDIDevice(name="gpu.tessera.io/claim=u1-gpu-0")],
                        driver_name="gpu.tessera.io", pool_name="tessera-real-0",
                        device_name="gpu-0", share_id="s-1")])])])])


def test_pod_resources_dynamic_resources_are_read() -> None:
    sock = Path(tempfile.mkdtemp(prefix="tpr-")) / "kubelet.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Kubelet(), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    try:
        (got,) = list_claim_devices(sock)
    finally:
        server.stop(None)
    assert (got.namespace, got.pod, got.container, got.claim) == ("team-a", "dra-pod", "main",
                                                                  "quarter")
    assert (got.driver, got.pool, got.device, got.share_id) == (
        "gpu.tessera.io", "tessera-real-0", "gpu-0", "s-1")
    assert got.cdi_devices == ("gpu.tessera.io/claim=u1-gpu-0",)

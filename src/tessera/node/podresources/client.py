"""Reading the kubelet's pod-resources API (v1 ``List``) over its unix socket."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from tessera.node.podresources import api_pb2, api_pb2_grpc

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
GPU_RESOURCE = "nvidia.com/gpu"


class PodResourcesError(RuntimeError):
    """The kubelet's pod-resources socket did not answer; the message names the socket."""


@dataclass(frozen=True)
class ContainerDevices:
    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


def list_devices(socket: Path = DEFAULT_SOCKET, timeout: float = 5.0) -> list[ContainerDevices]:
    """Every (pod, container, resource) the kubelet assigned devices to, as ``List`` says."""
    try:
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            stub = api_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
            reply = stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout)
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        raise PodResourcesError(f"kubelet pod-resources socket {socket}: {code}: {detail}") from exc
    out: list[ContainerDevices] = []
    for pod in reply.pod_resources:
        for c in pod.containers:
            for d in c.devices:
                out.append(ContainerDevices(namespace=pod.namespace, pod=pod.name,
                                            container=c.name, resource=d.resource_name,
                                            device_ids=tuple(d.device_ids)))
    return out


def gpus_by_pod(devices: list[ContainerDevices]) -> dict[tuple[str, str], list[str]]:
    """(namespace, pod) -> the ``nvidia.com/gpu`` device IDs of all its containers, in order."""
    out: dict[tuple[str, str], list[str]] = {}
    for d in devices:
        if d.resource == GPU_RESOURCE:
            out.setdefault((d.namespace, d.pod), []).extend(d.device_ids)
    return out


@dataclass(frozen=True)
class ContainerClaimDevice:
    """One DRA device the kubelet prepared for a container (``dynamic_resources``, field 5 of
    ``ContainerResources``: GA and always on in kubelet 1.36)."""

    namespace: str
    pod: str
    container: str
    claim: str
    claim_namespace: str
    driver: str
    pool: str
    device: str
    share_id: str
    cdi_devices: tuple[str, ...]


def claim_devices(reply: api_pb2.ListPodResourcesResponse) -> list[ContainerClaimDevice]:
    """Every DRA device of every container in a ``List`` reply."""
    out: list[ContainerClaimDevice] = []
    for pod in reply.pod_resources:
        for c in pod.containers:
            for dyn in c.dynamic_resources:
                for r in dyn.claim_resources:
                    out.append(ContainerClaimDevice(
                        namespace=pod.namespace, pod=pod.name, container=c.name,
                        claim=dyn.claim_name, claim_namespace=dyn.claim_namespace,
                        driver=r.driver_name, pool=r.pool_name, device=r.device_name,
                        share_id=r.share_id if r.HasField("share_id") else "",
                        cdi_devices=tuple(d.name for d in r.cdi_devices)))
    return out


def list_claim_devices(socket: Path = DEFAULT_SOCKET,
                       timeout: float = 5.0) -> list[ContainerClaimDevice]:
    """The DRA devices the kubelet reports per container (see :class:`ContainerClaimDevice`)."""
    try:
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            stub = api_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
            reply = stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout)
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        raise PodResourcesError(f"kubelet pod-resources socket {socket}: {code}: {detail}") from exc
    return claim_devices(reply)

"""A device plugin for ``nvidia.com/gpu`` on the real node: a TEST DOUBLE for the GPU side only.

The real-node tier (docs/real-node.md) needs a node that advertises ``nvidia.com/gpu`` for the
webhook path (tessera-scheduler's reservation pods ask for it). NVIDIA's k8s-device-plugin is a
Go program that reads the GPUs through NVML and starts a device per GPU; this double does the
same with the kubelet's own device-plugin gRPC API v1beta1 (upstream's proto, package, service,
message names and field numbers: ``deviceplugin.proto``), over the kubelet's real unix sockets:

- it serves ``v1beta1.DevicePlugin`` on ``<device-plugins dir>/<name>.sock``;
- it calls ``v1beta1.Registration/Register`` on ``<device-plugins dir>/kubelet.sock`` with
  ``resource_name=nvidia.com/gpu`` and version ``v1beta1``, as NVIDIA's does;
- ``ListAndWatch`` sends one ``Healthy`` device per GPU UUID given (NVIDIA's IDs are the UUIDs
  too) and keeps the stream open;
- ``Allocate`` answers ``NVIDIA_VISIBLE_DEVICES=<the allocated UUIDs>`` per container, what
  NVIDIA's plugin does with its default ``envvar`` device-list strategy.

It re-registers when the kubelet restarts (its socket is made again). It does not read NVML:
the GPUs are named on the command line (the fake NVML's UUIDs), so it models no health events,
no MIG strategy and no time-slicing.

    python -m tessera.testing.deviceplugin --dir ROOT/device-plugins GPU-... [GPU-...]
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from tessera.testing.deviceplugin import deviceplugin_pb2 as pb
from tessera.testing.deviceplugin import deviceplugin_pb2_grpc as pb_grpc

RESOURCE = "nvidia.com/gpu"
VERSION = "v1beta1"
log = logging.getLogger("tessera-test-device-plugin")


class Plugin(pb_grpc.DevicePluginServicer):
    def __init__(self, uuids: list[str]) -> None:
        self.uuids = uuids
        self.stop = threading.Event()

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return pb.DevicePluginOptions()

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID=u, health="Healthy")
                                               for u in self.uuids])
        while not self.stop.wait(1.0) and context.is_active():
            pass

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        return pb.PreferredAllocationResponse()

    def Allocate(self, request: Any, context: Any) -> Any:
        responses = []
        for c in request.container_requests:
            unknown = [d for d in c.devices_ids if d not in self.uuids]
            if unknown:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown devices {unknown}")
            log.info("allocate %s", list(c.devices_ids))
            responses.append(pb.ContainerAllocateResponse(
                envs={"NVIDIA_VISIBLE_DEVICES": ",".join(c.devices_ids)}))
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        return pb.PreStartContainerResponse()


def register(directory: Path, endpoint: str) -> None:
    with grpc.insecure_channel(f"unix://{directory / 'kubelet.sock'}") as channel:
        pb_grpc.RegistrationStub(channel).Register(  # type: ignore[no-untyped-call]
            pb.RegisterRequest(version=VERSION, endpoint=endpoint, resource_name=RESOURCE,
                               options=pb.DevicePluginOptions()), timeout=10)


def serve(directory: Path, uuids: list[str], name: str = "nvidia-gpu") -> None:
    endpoint = f"{name}.sock"
    socket = directory / endpoint
    while True:  # (re)serve and (re)register: the kubelet wipes the directory when it restarts
        while not (directory / "kubelet.sock").exists():
            time.sleep(0.2)
        socket.unlink(missing_ok=True)
        plugin = Plugin(uuids)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_DevicePluginServicer_to_server(plugin, server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{socket}")
        server.start()
        register(directory, endpoint)
        log.info("registered %s with %d devices: %s", RESOURCE, len(uuids), uuids)
        kubelet_sock = os.stat(directory / "kubelet.sock").st_ino
        while socket.exists():
            try:
                if os.stat(directory / "kubelet.sock").st_ino != kubelet_sock:
                    break
            except FileNotFoundError:
                break
            time.sleep(0.5)
        log.info("the kubelet restarted or removed our socket; registering again")
        plugin.stop.set()
        server.stop(1)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tessera.testing.deviceplugin")
    parser.add_argument("--dir", type=Path, required=True,
                        help="the kubelet's device-plugins directory (holds kubelet.sock)")
    parser.add_argument("uuids", nargs="+", help="the GPUs to advertise (UUIDs)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    serve(args.dir, args.uuids)


if __name__ == "__main__":
    main()

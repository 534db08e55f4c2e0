"""The kubelet's plugin watcher, for the kubelet double of kwok nodes.

A real kubelet watches ``plugins_registry/`` and, for each socket that appears, calls the
plugin's ``GetInfo`` and then ``NotifyRegistrationStatus(plugin_registered=true)`` (about a
second after the socket appears). tessera-node publishes its ResourceSlice only after that
notification (a pod scheduled earlier would wait in the kubelet's back-off), so the double does
the same for every simulated node: a socket is registered once, again when it is made anew (a
restarted agent), and a plugin of the wrong type is told why it was not registered.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import grpc

from tessera.node.draplugin import registration_pb2, registration_pb2_grpc

log = logging.getLogger("tessera.testing.kubelet")
PERIOD_S = 0.5


def register(socket: Path, timeout: float = 5.0) -> str:
    """GetInfo, then NotifyRegistrationStatus; returns the plugin's name (raises grpc.RpcError)."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = registration_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
        info = stub.GetInfo(registration_pb2.InfoRequest(), timeout=timeout)
        ok = info.type == "DRAPlugin" and "v1.DRAPlugin" in info.supported_versions
        stub.NotifyRegistrationStatus(registration_pb2.RegistrationStatus(
            plugin_registered=ok,
            error="" if ok else f"plugin type {info.type} / versions "
            f"{list(info.supported_versions)}: this kubelet serves DRAPlugin v1.DRAPlugin"),
            timeout=timeout)
        return str(info.name)


async def watch(registry_dirs: list[Path]) -> None:
    """Registers every plugin socket that appears in ``registry_dirs`` until cancelled."""
    done: dict[Path, tuple[int, int]] = {}
    while True:
        present: set[Path] = set()
        for d in registry_dirs:
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for e in entries:
                if not e.name.endswith(".sock"):
                    continue
                path = Path(e.path)
                present.add(path)
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                # a restarted plugin makes its socket anew: the inode number may be reused at
                # once, its change time is not (the kubelet sees it as a create event)
                made = (st.st_ino, st.st_ctime_ns)
                if done.get(path) == made:
                    continue
                try:
                    name = await asyncio.to_thread(register, path)
                except grpc.RpcError as exc:
                    log.info("plugin socket %s not registered yet: %s", path, exc)
                    continue
                done[path] = made
                log.info("registered plugin %s (%s)", name, path)
        for gone in set(done) - present:
            del done[gone]
        await asyncio.sleep(PERIOD_S)

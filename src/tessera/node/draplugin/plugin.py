"""The kubelet's DRA plugin for gpu.tessera.io: registration and NodePrepareResources /
NodeUnprepareResources (DRAPlugin v1, what kubelet 1.36 speaks).

Prepare reads the claim from the API server (its UID must match: a claim deleted and made
again under the same name is not the one the kubelet means), takes the results of driver
gpu.tessera.io in its allocation that are on this node's pool, and writes one CDI spec per
claim (``CDI_DIR/gpu.tessera.io-claim_UID.json``): per device the GPU by UUID
(``NVIDIA_VISIBLE_DEVICES``), the isolation library (mounted read-only, ``LD_PRELOAD``) and
the limit, which is the memory the claim consumed on it. The reply names the CDI devices.
Unprepare deletes the spec. Both are idempotent; the spec files are the only state, so a
restarted plugin prepares and unprepares the same way. A claim not allocated here, or naming a
GPU this node does not have, is an error for that claim (the kubelet does not start the
container): never a device without its limit.

Not wired into ``tessera-node run`` yet: :func:`serve` runs the two gRPC servers; the tests
drive it with a gRPC client acting as the kubelet.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from tessera.core.errors import InvalidRequest
from tessera.core.units import parse_memory
from tessera.isolation.config import manual_environment
from tessera.isolation.library import LIBRARY_NAME
from tessera.node.draplugin import dra_pb2, dra_pb2_grpc, registration_pb2, registration_pb2_grpc

DRIVER = "gpu.tessera.io"
CDI_KIND = "gpu.tessera.io/claim"
CDI_VERSION = "0.6.0"


@dataclass(frozen=True)
class PluginConfig:
    node: str
    uuids: Mapping[int, str]
    """GPU index -> UUID on this node (NVML)."""
    cdi_dir: Path
    library_dir: Path
    """Host directory of the isolation library (tessera-node installs it)."""
    library_mount: str = "/usr/local/tessera"
    library_name: str = LIBRARY_NAME
    """The file tessera-node installs there (a symlink to the current build, tessera.node.install)."""


def cdi_spec(claim: Mapping[str, Any], cfg: PluginConfig) -> tuple[dict[str, Any], list[Any]]:
    """The CDI spec of an allocated claim and the kubelet's Device entries; InvalidRequest
    naming what is wrong."""
    uid = (claim.get("metadata") or {}).get("uid", "")
    results = [r for r in (((claim.get("status") or {}).get("allocation") or {}).get("devices")
                           or {}).get("results") or [] if r.get("driver") == DRIVER]
    if not results:
        raise InvalidRequest("status.allocation", f"has no {DRIVER} device: not allocated")
    devices, replies = [], []
    for r in results:
        if r.get("pool") != cfg.node:
            raise InvalidRequest("status.allocation.devices.results.pool",
                                 f"is {r.get('pool')!r}, not this node {cfg.node!r}")
        name = str(r.get("device", ""))
        index = int(name[4:]) if name.startswith("gpu-") and name[4:].isdigit() else -1
        if index not in cfg.uuids:
            raise InvalidRequest("status.allocation.devices.results.device",
                                 f"names {name!r}, which NVML on {cfg.node} does not list")
        consumed = (r.get("consumedCapacity") or {}).get("memory")
        if consumed is None:
            raise InvalidRequest("status.allocation.devices.results.consumedCapacity.memory",
                                 "is missing: no limit to enforce (fails closed)")
        limit = parse_memory(consumed, "consumedCapacity.memory")
        env = manual_environment(limit, library=Path(cfg.library_mount) / cfg.library_name)
        env["NVIDIA_VISIBLE_DEVICES"] = cfg.uuids[index]
        cdi_name = f"{uid}-{name}"
        devices.append({"name": cdi_name, "containerEdits": {
            "env": [f"{k}={v}" for k, v in sorted(env.items())],
            "mounts": [{"hostPath": str(cfg.library_dir), "containerPath": cfg.library_mount,
                        "options": ["ro", "bind"]}]}})
        reply = dra_pb2.Device(request_names=[str(r.get("request", ""))], pool_name=cfg.node,
                               device_name=name, cdi_device_ids=[f"{CDI_KIND}={cdi_name}"])
        if r.get("shareID"):
            reply.share_id = str(r["shareID"])
        replies.append(reply)
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": devices}, replies


def spec_path(cfg: PluginConfig, claim_uid: str) -> Path:
    if not claim_uid or "/" in claim_uid or claim_uid.startswith("."):
        raise InvalidRequest("claim.uid", "must be a UID", claim_uid)
    return cfg.cdi_dir / f"gpu.tessera.io-{claim_uid}.json"


class DraPlugin(dra_pb2_grpc.DRAPluginServicer):
    def __init__(self, cfg: PluginConfig, get_claim: Callable[[str, str], Mapping[str, Any]]
                 ) -> None:
        self.cfg = cfg
        self.get_claim = get_claim
        """(namespace, name) -> the claim as a dict (from the API server)."""

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        out = dra_pb2.NodePrepareResourcesResponse()
        for c in request.claims:
            try:
                claim = self.get_claim(c.namespace, c.name)
                got = (claim.get("metadata") or {}).get("uid")
                if got != c.uid:
                    raise InvalidRequest("claim.uid", f"the API server's claim has UID {got}",
                                         c.uid)
                spec, devices = cdi_spec(claim, self.cfg)
                path = spec_path(self.cfg, c.uid)
                self.cfg.cdi_dir.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(json.dumps(spec, indent=1))
                tmp.replace(path)
                out.claims[c.uid].devices.extend(devices)
            except Exception as exc:  # one claim's error must not fail the others
                out.claims[c.uid].error = f"claim {c.namespace}/{c.name}: {exc}"
        return out

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        out = dra_pb2.NodeUnprepareResourcesResponse()
        for c in request.claims:
            try:
                spec_path(self.cfg, c.uid).unlink(missing_ok=True)
                out.claims[c.uid].error = ""
            except Exception as exc:
                out.claims[c.uid].error = f"claim {c.namespace}/{c.name}: {exc}"
        return out


class Registration(registration_pb2_grpc.RegistrationServicer):
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.status: tuple[bool, str] | None = None

    def GetInfo(self, request: Any, context: Any) -> Any:
        return registration_pb2.PluginInfo(type="DRAPlugin", name=DRIVER, endpoint=self.endpoint,
                                           supported_versions=["v1.DRAPlugin"])

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.status = (request.plugin_registered, request.error)
        return registration_pb2.RegistrationStatusResponse()


def serve(cfg: PluginConfig, get_claim: Callable[[str, str], Mapping[str, Any]],
          plugin_socket: Path, registration_socket: Path) -> tuple[grpc.Server, Registration]:
    """Starts the DRA service on ``plugin_socket`` and registration on
    ``registration_socket`` (the kubelet's plugins_registry directory); returns the server
    (``stop()`` it) and the registration servicer (what the kubelet said)."""
    for sock in (plugin_socket, registration_socket):
        sock.unlink(missing_ok=True)  # a socket a previous run left
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    dra_pb2_grpc.add_DRAPluginServicer_to_server(  # type: ignore[no-untyped-call]
        DraPlugin(cfg, get_claim), server)
    reg = Registration(str(plugin_socket))
    registration_pb2_grpc.add_RegistrationServicer_to_server(  # type: ignore[no-untyped-call]
        reg, server)
    server.add_insecure_port(f"unix://{plugin_socket}")
    server.add_insecure_port(f"unix://{registration_socket}")
    server.start()
    return server, reg

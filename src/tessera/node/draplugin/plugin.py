"""The kubelet's DRA plugin for gpu.tessera.io: registration and NodePrepareResources /
NodeUnprepareResources (DRAPlugin v1, what kubelet 1.36 speaks).

Prepare reads the claim from the API server (its UID must match: a claim deleted and made
again under the same name is not the one the kubelet means), takes the results of driver
gpu.tessera.io in its allocation that are on this node's pool, writes the claim's isolation
files and its CDI spec (:mod:`tessera.node.draplugin.cdi`) and replies with the CDI devices.
Unprepare deletes them. Both are idempotent; the files are the only state, so a restarted
plugin prepares and unprepares the same way. A claim not allocated here, naming a GPU this node
does not have, or arriving while the node is not ready for shares is an error for that claim
(the kubelet does not start the container): never a device without its limit.

``tessera-node run`` starts it (:func:`serve`) next to the agent; the tests also drive it with
a gRPC client acting as the kubelet.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from tessera.core.errors import InvalidRequest
from tessera.node.draplugin import (
    dra_pb2,
    dra_pb2_grpc,
    health_pb2_grpc,
    registration_pb2,
    registration_pb2_grpc,
)
from tessera.node.draplugin.cdi import (
    DRIVER,
    PluginConfig,
    cdi_name,
    cdi_spec,
    check_uid,
    claim_devices,
    config_text,
    is_mig_claim,
    mig_cdi_spec,
    mig_devices,
    pods_group,
    pods_priority_class,
    remove_claim,
    write_claim_files,
    write_spec,
)
from tessera.node.draplugin.compute import claim_compute, prepare_compute, release_compute
from tessera.node.draplugin.health import DraHealth

log = logging.getLogger("tessera.node.dra")

__all__ = ["DRIVER", "DraPlugin", "PluginConfig", "Registration", "serve"]

Getter = Callable[[str, str], Mapping[str, Any]]
"""(namespace, name) -> the object as a dict (from the API server); raises when absent."""


class DraPlugin(dra_pb2_grpc.DRAPluginServicer):
    def __init__(self, cfg: PluginConfig | Callable[[], PluginConfig], get_claim: Getter,
                 get_pod: Getter | None = None) -> None:
        self.cfg = cfg
        self.get_claim = get_claim
        self.get_pod = get_pod
        """The pods the claim is reserved for: the region's group, the loans' priority (None:
        root's region, the default priority)."""

    def config(self) -> PluginConfig:
        return self.cfg() if callable(self.cfg) else self.cfg

    def users(self, claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """The pods the claim is reserved for, as the API server has them now."""
        if self.get_pod is None:
            return []
        meta = claim.get("metadata") or {}
        pods = []
        for ref in (claim.get("status") or {}).get("reservedFor") or []:
            if ref.get("resource") != "pods":
                continue
            try:
                pod = self.get_pod(str(meta.get("namespace", "")), str(ref.get("name", "")))
            except Exception:  # a pod gone meanwhile states nothing
                continue
            if (pod.get("metadata") or {}).get("uid") == ref.get("uid"):
                pods.append(pod)
        return pods

    def prepare(self, c: Any) -> list[Any]:
        cfg = self.config()
        check_uid(c.uid)
        if cfg.not_ready:
            raise InvalidRequest("node", f"{cfg.node} is not ready for GPU shares: "
                                         f"{cfg.not_ready}")
        claim = self.get_claim(c.namespace, c.name)
        got = (claim.get("metadata") or {}).get("uid")
        if got != c.uid:
            raise InvalidRequest("claim.uid", f"the API server's claim has UID {got}", c.uid)
        if is_mig_claim(claim):
            return self.prepare_mig(c.uid, claim, cfg)
        devices = claim_devices(claim, cfg)
        if cfg.claims_dir is not None:
            users = self.users(claim)
            name = str((claim.get("metadata") or {}).get("name", ""))
            text = config_text(c.uid, devices, cfg, pods_priority_class(users))
            write_claim_files(cfg, c.uid, text, pods_group(users, name))
            prepare_compute(cfg, c.uid, devices, claim, pods_priority_class(users))
        elif claim_compute(claim) is not None:
            prepare_compute(cfg, c.uid, devices, claim)  # refuses: nowhere to write the conf
        write_spec(cfg, c.uid, cdi_spec(c.uid, devices, cfg))
        replies = []
        for d in devices:
            reply = dra_pb2.Device(request_names=[d.request], pool_name=cfg.node,
                                   device_name=d.name,
                                   cdi_device_ids=[f"{DRIVER}/claim={cdi_name(c.uid, d)}"])
            if d.share_id:
                reply.share_id = d.share_id
            replies.append(reply)
        return replies

    def prepare_mig(self, uid: str, claim: Mapping[str, Any], cfg: PluginConfig) -> list[Any]:
        """A claim of MIG partitions (class mig.tessera.io): each made or reused on its GPU
        (:meth:`tessera.node.kube_mig.KubeMig.prepare_claim`, journaled); on an error the ones
        already given to the claim are left idle and the error names the step."""
        devices = mig_devices(claim, cfg)
        if cfg.mig is None:
            raise InvalidRequest("status.allocation.devices.results.device",
                                 f"names MIG partition {devices[0].name}, but MIG partitions "
                                 f"are not available on {cfg.node} (no GPU in MIG mode, or "
                                 "its journal could not be read: see tessera-node's log)")
        uuids = []
        for d in devices:
            try:
                uuids.append(str(cfg.mig.prepare_claim(uid, d.gpu, d.profile, d.start).uuid))
            except Exception as exc:
                cfg.mig.release_claim(uid)
                raise RuntimeError(f"MIG {d.profile} at memory slot {d.start} of GPU {d.index} "
                                   f"({d.gpu}): {exc}") from None
        write_spec(cfg, uid, mig_cdi_spec(uid, devices, uuids))
        return [dra_pb2.Device(request_names=[d.request], pool_name=cfg.node,
                               device_name=d.name,
                               cdi_device_ids=[f"{DRIVER}/claim={uid}-{d.name}"])
                for d in devices]

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        out = dra_pb2.NodePrepareResourcesResponse()
        for c in request.claims:
            try:
                out.claims[c.uid].devices.extend(self.prepare(c))
            except Exception as exc:  # one claim's error must not fail the others
                out.claims[c.uid].error = f"claim {c.namespace}/{c.name}: {exc}"
        return out

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        out = dra_pb2.NodeUnprepareResourcesResponse()
        for c in request.claims:
            try:
                cfg = self.config()
                remove_claim(cfg, c.uid)
                release_compute(cfg, c.uid)
                if cfg.mig is not None:
                    cfg.mig.release_claim(c.uid)  # left idle, for reuse
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
        if request.plugin_registered:
            log.info("the kubelet registered DRA plugin %s", DRIVER)
        else:
            log.warning("the kubelet did not register DRA plugin %s: %s", DRIVER, request.error)
        return registration_pb2.RegistrationStatusResponse()


def serve(cfg: PluginConfig | Callable[[], PluginConfig], get_claim: Getter,
          plugin_socket: Path, registration_socket: Path, get_pod: Getter | None = None
          ) -> tuple[grpc.Server, Registration]:
    """Starts the DRA service on ``plugin_socket`` and registration on
    ``registration_socket`` (the kubelet's plugins_registry directory); returns the server
    (``stop()`` it) and the registration servicer (what the kubelet said)."""
    for sock in (plugin_socket, registration_socket):
        sock.parent.mkdir(parents=True, exist_ok=True)
        sock.unlink(missing_ok=True)  # a socket a previous run left
    # one worker per open stream (the kubelet's NodeWatchResources) plus the unary calls
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    dra_pb2_grpc.add_DRAPluginServicer_to_server(  # type: ignore[no-untyped-call]
        DraPlugin(cfg, get_claim, get_pod), server)
    health_pb2_grpc.add_DRAResourceHealthServicer_to_server(  # type: ignore[no-untyped-call]
        DraHealth(cfg if callable(cfg) else (lambda: cfg)), server)
    reg = Registration(str(plugin_socket))
    registration_pb2_grpc.add_RegistrationServicer_to_server(  # type: ignore[no-untyped-call]
        reg, server)
    server.add_insecure_port(f"unix://{plugin_socket}")
    server.add_insecure_port(f"unix://{registration_socket}")
    server.start()
    return server, reg

"""The kubelet plugin inside ``tessera-node run``: where its sockets and files go, whether it
starts, and the node state it prepares claims from (the agent's).

    /var/lib/kubelet/plugins_registry/gpu.tessera.io-reg.sock   registration (the kubelet
                                                                watches this directory)
    /var/lib/kubelet/plugins/gpu.tessera.io/dra.sock            DRAPlugin v1
    /var/run/cdi/gpu.tessera.io-UID.json                        one CDI spec per prepared claim
    CONTAINERS_DIR/claims/UID/                                  the claim's config and region

It starts when the API server serves ``resource.k8s.io/v1`` (unless ``--no-dra-plugin``). The
node's ResourceSlice is published only while it serves and once the kubelet has registered it
(NotifyRegistrationStatus registered=true): a GPU allocated through a claim on a node whose
kubelet has no gpu.tessera.io plugin yet would leave the pod in the kubelet's back-off (83 s on a
real kubelet, where the plugin watcher registers a new socket about a second after it appears).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from lightkube import ApiError, Client, KubeConfig
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Pod

from tessera.node.draplugin.cdi import DRIVER, PluginConfig
from tessera.node.draplugin.plugin import Registration, serve
from tessera.node.resourceslice import ResourceSlice

log = logging.getLogger("tessera.node.dra")

ResourceClaim = create_namespaced_resource("resource.k8s.io", "v1", "ResourceClaim",
                                           "resourceclaims")
REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
PLUGIN_DIR = f"/var/lib/kubelet/plugins/{DRIVER}"
CDI_DIR = "/var/run/cdi"
REGISTRATION_SOCKET = f"{DRIVER}-reg.sock"
PLUGIN_SOCKET = "dra.sock"


@dataclass(frozen=True)
class DraPaths:
    registry_dir: Path = Path(REGISTRY_DIR)
    plugin_dir: Path = Path(PLUGIN_DIR)
    cdi_dir: Path = Path(CDI_DIR)

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / REGISTRATION_SOCKET

    @property
    def plugin_socket(self) -> Path:
        return self.plugin_dir / PLUGIN_SOCKET


def sync_client(kubeconfig: str | None) -> Client:
    config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    return Client(config, field_manager="tessera-node")


def dra_served(client: Client) -> tuple[bool, str]:
    """Whether the API server serves resource.k8s.io/v1 (one list of at most one slice); the
    reason when not. Only "not found" means not served: another error (RBAC) still starts the
    plugin, and the error shows where it matters (the slice, the claims)."""
    try:
        for _ in client.list(ResourceSlice, chunk_size=1):
            break
    except ApiError as exc:
        if exc.status.code == 404:
            return False, "the API server does not serve resource.k8s.io/v1"
    except Exception as exc:  # API server not reachable yet: the agent retries, the plugin waits
        log.warning("could not ask the API server whether it serves resource.k8s.io/v1 (%s); "
                    "starting the DRA kubelet plugin", exc)
    return True, ""


class DraService:
    """The running plugin: ``start`` it, ``stop`` it."""

    def __init__(self, paths: DraPaths, client: Client,
                 config: Callable[[], PluginConfig]) -> None:
        self.paths = paths
        self.client = client
        self.config = config
        self.server: grpc.Server | None = None
        self.registration: Registration | None = None

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        return dict(self.client.get(ResourceClaim, name, namespace=namespace).to_dict())  # type: ignore[no-untyped-call]

    def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        return dict(self.client.get(Pod, name, namespace=namespace).to_dict())

    def start(self) -> None:
        """Raises OSError or RuntimeError (a socket that cannot be made)."""
        self.server, self.registration = serve(
            self.config, self.get_claim, self.paths.plugin_socket,
            self.paths.registration_socket, get_pod=self.get_pod)
        log.info("DRA kubelet plugin %s: registration %s, plugin %s, CDI specs in %s", DRIVER,
                 self.paths.registration_socket, self.paths.plugin_socket, self.paths.cdi_dir)

    def registered(self) -> bool:
        """Whether the kubelet registered the plugin (NotifyRegistrationStatus registered=true
        and no error since this process started serving)."""
        return self.registration is not None and self.registration.status == (True, "")

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(None)
            self.server = None
        for sock in (self.paths.plugin_socket, self.paths.registration_socket):
            sock.unlink(missing_ok=True)  # the kubelet deregisters a plugin whose socket is gone

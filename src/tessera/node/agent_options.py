"""tessera-node's options on Kubernetes (the command line of ``tessera-node run``), and the pod
as the agent sees it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class AgentOptions:
    node_name: str
    kubeconfig: str | None = None
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    library_dir: Path = Path("/var/lib/tessera/isolation")
    library_mount: str = "/usr/local/tessera"
    containers_dir: Path = Path("/var/lib/tessera/containers")
    """Where this agent writes the per-container files (its mount of the host directory)."""
    containers_host_dir: Path = Path("/var/lib/tessera/containers")
    """The same directory as pods' hostPath volumes name it (the webhook's --containers-host-dir)."""
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 9400
    advertise_url: str = ""
    """Where the API server reaches this agent's ``/usage`` (published on the Node; empty:
    not published)."""
    on_escape: str = "warn"
    sync_interval: float = 1.0
    escape_tolerance: float = 0.05
    headroom_bytes: int | None = None
    """Bytes kept back per GPU (--headroom); None: measured here, else the model's default."""
    measure_headroom: bool = True
    loans_dir: Path | None = Path("/var/lib/tessera/loans")
    """The node's loans ledger directory (this agent's view; share containers see it at
    /run/tessera-loans); None: dynamic fractions' loans are not accounted."""
    plugin_options: dict[str, str] = field(default_factory=dict)
    dra_slices: bool = True
    """Publish this node's ResourceSlice (False: the kubelet plugin is not serving here, so a
    claim allocated on this node could not be prepared; any slice of this node is deleted)."""
    dra_registered: Callable[[], bool] = lambda: True
    """Whether the kubelet has registered the plugin (its NotifyRegistrationStatus said so): the
    slice waits for it, so no pod is scheduled here before the kubelet can prepare its claim."""


@dataclass
class PodView:
    namespace: str
    name: str
    uid: str
    annotations: dict[str, str]
    labels: dict[str, str]
    volumes: list[dict[str, Any]]
    deleting: bool
    spec: dict[str, Any] = field(default_factory=dict)
    """The pod's spec (for the group its share container's processes run with)."""
    finished: bool = False
    """Succeeded or Failed: holds nothing any more."""


def pod_view(pod: Any) -> PodView:
    d = pod if isinstance(pod, dict) else pod.to_dict()
    meta = d.get("metadata") or {}
    spec = d.get("spec") or {}
    return PodView(namespace=meta.get("namespace", ""), name=meta.get("name", ""),
                   uid=meta.get("uid", ""), annotations=dict(meta.get("annotations") or {}),
                   labels=dict(meta.get("labels") or {}), volumes=list(spec.get("volumes") or []),
                   deleting=meta.get("deletionTimestamp") is not None,
                   spec={k: spec.get(k) for k in ("securityContext", "containers", "initContainers")
                         if k in spec},
                   finished=((d.get("status") or {}).get("phase") in ("Succeeded", "Failed")))

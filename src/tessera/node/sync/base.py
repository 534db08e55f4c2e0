"""The extension point of tessera-node on Kubernetes: a sync step.

The agent (:mod:`tessera.node.agent`) runs every step in :data:`tessera.node.sync.STEPS`, in
order, at each sync (every ``--sync-interval`` seconds and at once after a pod on its node
changes). Steps share one :class:`NodeContext`: what the node is (NVML, inventory, headroom,
readiness), the pods on it, and what earlier steps found this sync (MIG partitions, shares,
usage). A step keeps its own memory (what it last wrote, its back-off) on itself.

A step raising stops this sync (logged; the next sync starts over), after which every step's
``failed()`` is called: a step that skips unchanged writes forgets what it wrote there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tessera.node.agent_options import AgentOptions, PodView
from tessera.node.containers import Share
from tessera.node.events import EventPoster
from tessera.node.headroom import DeviceHeadroom
from tessera.node.kube_mig import KubeMig, Want
from tessera.node.mig import MigGpuState
from tessera.node.nvml import Inventory, Nvml
from tessera.node.observe import Observer
from tessera.node.usage import NodeUsage


@dataclass
class MigView:
    """The node's MIG partitions as the MIG step last synced them (docs/mig.md)."""
    kube: KubeMig | None = None
    """None until some GPU is in MIG mode (tessera.node.sync.mig_partitions.start_mig)."""
    parts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """GPU UUID -> its partitions, as last published."""
    written: dict[str, str] = field(default_factory=dict)
    """Pod UID -> the MIG UUID written into its ConfigMap."""
    states: list[MigGpuState] | None = None
    """The MIG GPUs as the last MIG sync saw them (None before it)."""
    wants: list[Want] = field(default_factory=list)
    """What the annotation path's pods on this node asked for, at the last MIG sync."""


@dataclass(eq=False)
class NodeContext:
    opts: AgentOptions
    client: Any
    """lightkube's AsyncClient."""
    events: EventPoster
    nvml: Nvml | None
    nvml_error: str = ""
    inventory: Inventory | None = None
    library_error: str = ""
    dir_error: str = ""
    prepared: bool = False
    """readiness.prepare() has run to its end: before it, the kubelet plugin answers "not ready"
    (a prepare between the inventory and the MIG journal being read was refused as "MIG
    partitions are not available" instead of being retried)."""
    headroom: dict[int, DeviceHeadroom] = field(default_factory=dict)
    pods: dict[tuple[str, str], PodView] = field(default_factory=dict)
    """The pods bound to this node, kept by the agent's watch."""
    listed: bool = False
    """The pods were listed once (before it, nothing is removed for a pod not seen)."""
    mig: MigView = field(default_factory=MigView)
    shares: dict[str, Share] = field(default_factory=dict)
    """This sync's shares by key (tessera.node.sync.share_files)."""
    compute_conf: dict[str, str] = field(default_factory=dict)
    """Share key -> its gpu-compute.conf, this sync (tessera.node.sync.compute_arbiters)."""
    compute_errors: dict[str, str] = field(default_factory=dict)
    """Share key -> why its compute share cannot be enforced: no files are written for it."""
    usage: NodeUsage | None = None
    observer: Observer | None = None

    @property
    def ready(self) -> bool:
        # The inventory is read by prepare(): before it the node is still starting (the kubelet
        # plugin may be asked to prepare a claim meanwhile).
        return (self.prepared and self.nvml is not None and self.inventory is not None
                and not self.library_error and not self.dir_error)

    @property
    def reason(self) -> str:
        return "; ".join(r for r in (self.nvml_error, self.library_error, self.dir_error) if r)


class SyncStep:
    """One part of the node's sync; subclass it, then register it in tessera.node.sync.STEPS."""

    name = "step"

    async def sync(self, node: NodeContext) -> None:
        """Bring what this step owns in line with ``node``."""

    def urgent(self, pod: PodView) -> bool:
        """``pod`` (just seen by the agent's watch) needs this step now, not after the rest of
        a sync: the agent then runs this step alone at once (besides its place in the sync),
        so something the scheduler waits for is not queued behind unrelated steps."""
        return False

    def failed(self) -> None:
        """The sync stopped with an error: forget what would make the next sync skip a write."""

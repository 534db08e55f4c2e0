"""tessera-node on Kubernetes: one agent per node (the chart's DaemonSet).

Each sync (every ``--sync-interval`` seconds, and at once after a relevant pod change):

1. readiness: NVML open, the isolation library installed, the containers directory writable;
   published on the Node with the inventory (:mod:`tessera.node.publish`);
2. reservation pods on this node without ``tessera.io/gpu-uuid``: the kubelet's pod-resources
   ``List`` says which GPU the device plugin gave each; the UUID is written on the pod;
3. share pods on this node: their isolation files are written (:mod:`tessera.node.containers`);
   a pod naming a GPU this node does not have, or files that cannot be written, get an Event and
   no files (the container cannot start: the hostPath mounts are ``type: Directory``);
4. usage (NVML + the regions) for metrics, escape detection (``--on-escape warn|kill``) and the
   reclaimer plugin.

Restart safety: the agent keeps no state of its own. On start it lists the pods on its node,
finishes or undoes a half-done library install, rewrites every share's files (unchanged files
are left alone) and removes the directories of pods that are gone. It never kills a process for
a pod that no longer exists: decisions are made from the picture of this sync only.
(About 420 lines: the sync's four steps above, each delegating to its own module.)
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightkube import ApiError, AsyncClient, KubeConfig, codecs
from lightkube.resources.core_v1 import ConfigMap, Node, Pod
from lightkube.types import PatchType

from tessera import wire
from tessera.core.errors import InvalidRequest
from tessera.core.mig import PROFILES
from tessera.core.podgroups import share_group
from tessera.isolation.library import LibraryNotBuilt, library_path
from tessera.node import containers as files
from tessera.node import publish
from tessera.node import resourceslice as dra
from tessera.node.containers import Share, ShareDevice, ShareFilesError
from tessera.node.draplugin.cdi import PluginConfig
from tessera.node.headroom import DeviceHeadroom, headroom_for
from tessera.node.install import InstallError, install_library
from tessera.node.kube_mig import KubeMig, Outcome, Want, claim_of, partitions_doc, want_of
from tessera.node.mig import MigError, MigGpuState
from tessera.node.nvml import Inventory, Nvml
from tessera.node.observe import Observer
from tessera.node.plugins import NodePlugin
from tessera.node.podresources.client import PodResourcesError, gpus_by_pod, list_devices
from tessera.node.reclaim import prepare_directory
from tessera.node.usage import NodeUsage

log = logging.getLogger("tessera.node")

MIG_JOURNAL = "mig-journal.json"
"""In the containers directory (on the host, so it outlives the agent's pod)."""
COMPONENT = "tessera-node"
SLICE_RETRY_SECONDS = 30
POSTED_MAX = 4096
CLAIMS_SUBDIR = "claims"
"""Under the containers directory: the isolation files of prepared claims (by claim UID; the
share directories beside them are 16 hex digits, so neither side removes the other's)."""


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


def share_of(pod: PodView, containers_dir: Path, mig_uuid: str | None = None) -> Share | None:
    """The share a pod holds on this node, from what the scheduler and the webhook wrote on it;
    None for pods without a GPU share. A share a MIG partition serves (``tessera.io/mig-share``)
    holds ``mig_uuid``, the partition made for it (None: not made yet). Raises ShareFilesError
    naming what is wrong."""
    key = pod.annotations.get(wire.GPU_CONFIG_KEY)
    text = pod.annotations.get(wire.PLACEMENT)
    if not key or not text:
        return None
    served = pod.annotations.get(wire.MIG_SHARE)
    try:
        placement = wire.placement_from_json(text)
        if served is not None and not placement.devices:
            if mig_uuid is None:
                return None
            share = wire.mig_share_from_json(served)
            request, limit, uuids = [share.request], [share.limit], [mig_uuid]
        elif placement.exclusive or not placement.devices:
            return None
        else:
            request = list(placement.request_bytes)
            limit = list(placement.limit_bytes)
            uuids = [u for u in pod.annotations.get(wire.POD_GPU_UUIDS, "").split(",") if u]
    except (ValueError, KeyError, TypeError) as exc:
        raise ShareFilesError(f"annotation {wire.PLACEMENT} or {wire.MIG_SHARE} is not readable: "
                              f"{exc}") from exc
    if len(uuids) != len(request):
        raise ShareFilesError(f"annotation {wire.POD_GPU_UUIDS} names {len(uuids)} GPU(s) for "
                              f"{len(request)} device(s) of the placement")
    files.check_key(key)
    prefix = str(containers_dir / key / "conf") + "/"
    names = sorted({v["hostPath"]["path"][len(prefix):] for v in pod.volumes
                    if isinstance(v.get("hostPath"), dict)
                    and str(v["hostPath"].get("path", "")).startswith(prefix)})
    containers = tuple(n for n in names if n and "/" not in n)
    groups = {share_group(pod.spec, c) for c in containers}
    return Share(key=key, namespace=pod.namespace, pod=pod.name, uid=pod.uid,
                 containers=containers,
                 group=groups.pop() if len(groups) == 1 else None,
                 devices=tuple(ShareDevice(u, r, lim) for u, r, lim in
                               zip(uuids, request, limit, strict=True)),
                 workload=pod.annotations.get(wire.POD_GROUP) or pod.labels.get(wire.POD_GROUP) or pod.name,
                 project=pod.annotations.get(wire.PROJECT) or pod.labels.get(wire.PROJECT, ""),
                 priority_class=pod.annotations.get(wire.PRIORITY_CLASS, ""))


def load_plugin(options: dict[str, str]) -> NodePlugin | None:
    """The loan reclaimer, when this build has one (``tessera.node.reclaim``)."""
    if importlib.util.find_spec("tessera.node.reclaim") is None:
        return None
    module = importlib.import_module("tessera.node.reclaim")
    factory = getattr(module, "make_reclaimer", None)
    return factory(options) if factory is not None else None


class KubeAgent:
    def __init__(self, opts: AgentOptions, client: AsyncClient, nvml: Nvml | None,
                 nvml_error: str = "", plugin: NodePlugin | None = None) -> None:
        self.opts = opts
        self.client = client
        self.nvml = nvml
        self.nvml_error = nvml_error
        self.inventory: Inventory | None = None
        self.library_error = ""
        self.dir_error = ""
        self.pods: dict[tuple[str, str], PodView] = {}
        self.listed = False
        self.wake = asyncio.Event()
        self.observer = Observer(opts.node_name, nvml, None, opts.containers_dir, opts.on_escape,
                                 self._sink, opts.escape_tolerance, plugin)
        self.counters = self.observer.counters
        self.collector = self.observer.collector
        self._event_tasks: set[asyncio.Task[None]] = set()
        self.share_errors: dict[str, str] = {}
        self.posted: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        """Events posted (object, reason, message), not posted again; the last POSTED_MAX."""
        self.published: dict[str, str] | None = None
        self.uuids_written = 0
        self.syncs = 0
        self.usage: NodeUsage | None = None
        self.shares: dict[str, Share] = {}
        self.headroom: dict[int, DeviceHeadroom] = {}
        self.slice_digest: str | None = None
        """Digest of the devices last written to this node's ResourceSlice ("" when it was
        deleted; None before the first sync)."""
        self.slice_writes = 0
        self.slice_error = ""
        self.slice_retry_at = 0.0
        self.mig: KubeMig | None = None
        self.mig_parts: dict[str, list[dict[str, Any]]] = {}
        """GPU UUID -> its partitions, as last published."""
        self.mig_written: dict[str, str] = {}
        """Pod UID -> the MIG UUID written into its ConfigMap."""
        self.mig_failed: dict[str, tuple[int, float]] = {}
        """Pod UID -> (failed attempts in a row, no new attempt before): 1 s doubling to 60 s."""
        self.mig_states: list[MigGpuState] | None = None
        """The MIG GPUs as the last MIG sync saw them (None before it)."""
        self.mig_wants: list[Want] = []
        """What the annotation path's pods on this node asked for, at the last MIG sync."""

    # ---- readiness ----------------------------------------------------------------------------
    def prepare(self) -> None:
        if self.nvml is not None:
            try:
                inventory = self.nvml.inventory()
            except Exception as exc:
                self.nvml_error = f"NVML inventory failed: {exc}"
                self.nvml = None
            else:
                # the headroom before the inventory: the inventory makes the node ready, and a
                # claim the kubelet plugin prepared in between got context-overhead 0
                if not self.headroom:
                    self.headroom = headroom_for(inventory, self.nvml, self.opts.headroom_bytes,
                                                 self.opts.measure_headroom)
                    for h in self.headroom.values():
                        log.info("GPU %s: headroom %d MiB (%s)", h.uuid, h.bytes // 2**20,
                                 h.source)
                self.inventory = inventory
        self._start_mig()
        try:
            installed = install_library(library_path(), self.opts.library_dir,
                                        self.opts.library_mount)
            log.info("isolation library %s at %s%s", installed.digest, installed.version_path,
                     "" if installed.changed else " (already installed)")
            self.library_error = ""
        except (InstallError, LibraryNotBuilt) as exc:
            self.library_error = str(exc)
        try:
            if self.opts.loans_dir is not None:
                prepare_directory(self.opts.loans_dir)
        except OSError as exc:
            self.dir_error = f"loans directory {self.opts.loans_dir} cannot be made: {exc}"
            return
        try:
            self.opts.containers_dir.mkdir(parents=True, exist_ok=True)
            probe = self.opts.containers_dir / f".tmp-probe.{os.getpid()}"
            probe.write_text("")
            probe.unlink()
            self.dir_error = ""
        except OSError as exc:
            self.dir_error = f"containers directory {self.opts.containers_dir} is not writable: {exc}"

    def _start_mig(self) -> None:
        """Partitions of MIG pods, once some GPU is in MIG mode (tessera.node.kube_mig)."""
        if self.inventory is not None and self.nvml is not None and self.mig is None \
                and any(g.mig_enabled for g in self.inventory.gpus):
            try:
                self.mig = KubeMig(self.nvml, self.opts.containers_dir / MIG_JOURNAL)
                for line in self.mig.repairs:
                    log.info("MIG journal: %s", line)
            except (MigError, OSError) as exc:
                log.warning("MIG partitions unavailable on this node: %s", exc)

    def follow_mig_modes(self) -> None:
        """MIG mode is the operator's (tessera never switches it); when it changes under a
        running agent, the inventory is read again, so the node's annotations (and the
        scheduler) stop offering a GPU in MIG mode for shares and start offering its profiles,
        or the other way round, without restarting tessera-node."""
        if self.inventory is None or self.nvml is None:
            return
        try:
            modes = self.nvml.mig_modes()
        except Exception as exc:
            log.warning("reading MIG modes failed: %r", exc)
            return
        before = tuple(g.mig_enabled for g in self.inventory.gpus)
        if modes == before:
            return
        for g, now in zip(self.inventory.gpus, modes, strict=False):
            if g.mig_enabled != now:
                log.info("GPU %d (%s): MIG mode is now %s (an operator's change); inventory "
                         "read again", g.index, g.uuid, "on" if now else "off")
        self.inventory = self.nvml.inventory()
        self._start_mig()

    @property
    def ready(self) -> bool:
        # The inventory is read by prepare(): before it the node is still starting (the kubelet
        # plugin may be asked to prepare a claim meanwhile).
        return (self.nvml is not None and self.inventory is not None and not self.library_error
                and not self.dir_error)

    @property
    def reason(self) -> str:
        return "; ".join(r for r in (self.nvml_error, self.library_error, self.dir_error) if r)

    async def publish_node(self) -> None:
        ann = publish.node_annotations(self.inventory, self.ready, self.reason, self.headroom,
                                       self.opts.advertise_url, self.mig_parts)
        labels: dict[str, str] = {}
        if self.inventory is not None:
            node = await self.client.get(Node, self.opts.node_name)
            present = dict((node.metadata.labels if node.metadata else None) or {})
            labels = publish.missing_labels(self.inventory, present)
        want = {**ann, **{f"label:{k}": v for k, v in labels.items()}}
        if want == self.published:
            return
        patch: dict[str, Any] = {"metadata": {"annotations": ann}}
        if labels:
            patch["metadata"]["labels"] = labels
        await self.client.patch(Node, self.opts.node_name, patch, patch_type=PatchType.MERGE)
        self.published = want
        self.collector.ready = self.ready
        log.info("node %s: ready=%s%s", self.opts.node_name, self.ready,
                 f" ({self.reason})" if not self.ready else "")

    # ---- DRA: this node's ResourceSlices (tessera.node.resourceslice, docs/dra.md) ---------
    def mig_offers(self) -> list[dra.MigOffer]:
        """This node's GPUs in MIG mode as the slice offers their partitions: every placement
        NVML lists except those overlapping a partition tessera did not make, one a pod of the
        annotation path holds, or one such a pod was bound to and is still to be made."""
        if self.mig_states is None or self.inventory is None:
            return []
        names = {g.uuid: g.name for g in self.inventory.gpus}
        out = []
        for st in self.mig_states:
            if not st.mig_enabled or st.model not in PROFILES:
                continue
            table = PROFILES[st.model]
            blocked = [(p.start, p.size) for p in st.partitions
                       if not p.managed or (p.owner is not None and not claim_of(p.owner))]
            blocked += [(w.start, table[w.profile].slots) for w in self.mig_wants
                        if w.gpu == st.uuid and w.profile in table]
            out.append(dra.MigOffer(
                st.index, st.uuid, st.model, names.get(st.uuid, st.model),
                {p.name: p.placements for p in st.profiles},
                {p.name: p.memory_mib for p in st.profiles}, tuple(sorted(set(blocked)))))
        return out

    async def publish_slice(self) -> None:
        """Keeps this node's pool of driver gpu.tessera.io: the GPUs' slice, and for GPUs in
        MIG mode the counters' slice and the MIG devices' slices. Written when their content
        changes (every slice of the pool again, with the pool's generation one up), deleted
        while the node is not ready (nothing would enforce a share allocated here); slices of
        this driver for this node under other names are removed (an older agent's). No write
        when nothing changed."""
        if self.mig is not None and self.mig_states is None:
            return  # the first MIG sync says which placements are free to offer
        inventory = self.inventory if self.ready and self.opts.dra_slices else None
        if inventory is not None and not self.opts.dra_registered():
            return  # until the kubelet registers the plugin: nothing new, nothing withdrawn
        specs = dra.pool_specs(inventory, self.headroom, self.mig_offers()) if inventory else {}
        digest = dra.pool_digest(specs) if specs else ""
        if digest == self.slice_digest:
            return
        base = dra.slice_name(self.opts.node_name)
        wanted = {base + suffix: suffix for suffix in specs}
        current: dict[str, Any] = {}
        async for obj in self.client.list(dra.ResourceSlice,
                                          fields={"spec.nodeName": self.opts.node_name,
                                                  "spec.driver": dra.DRIVER}):
            other = (obj.metadata.name if obj.metadata else None) or ""
            if other in wanted:
                current[other] = obj
            elif other:
                with contextlib.suppress(ApiError):
                    await self.client.delete(dra.ResourceSlice, other)
                log.info("removed ResourceSlice %s (%s)", other,
                         "not this agent's name" if not other.startswith(base)
                         else "no longer in the pool")
        if not specs:
            for name in current:
                with contextlib.suppress(ApiError):
                    await self.client.delete(dra.ResourceSlice, name)
                log.info("removed ResourceSlice %s: node not ready for GPU shares", name)
            self.slice_digest = ""
            return
        have = {}
        generations = set()
        for name, obj in current.items():
            spec = obj.spec or {}
            key = "sharedCounters" if "sharedCounters" in specs[wanted[name]] else "devices"
            have[wanted[name]] = {key: spec.get(key) or []}
            pool = spec.get("pool") or {}
            generations.add((int(pool.get("generation", 0)), int(pool.get("resourceSliceCount", 0))))
        if len(current) == len(specs) and len(generations) == 1 \
                and next(iter(generations))[1] == len(specs) and dra.pool_digest(have) == digest:
            self.slice_digest = digest  # a restarted agent: the pool is already right
            return
        node = await self.client.get(Node, self.opts.node_name)
        uid = (node.metadata.uid if node.metadata else None) or ""
        generation = max((g for g, _ in generations), default=0) + 1
        for want in dra.pool_slices(self.opts.node_name, uid, specs, generation):
            old = current.get(want["metadata"]["name"])
            if old is None:
                await self.client.create(codecs.from_dict(want))
            else:
                want["metadata"]["resourceVersion"] = old.metadata.resourceVersion
                await self.client.replace(codecs.from_dict(want))
        self.slice_digest = digest
        self.slice_writes += 1
        mig = sum(len(s.get("devices") or []) for k, s in specs.items() if k.startswith("-mig-"))
        log.info("ResourceSlice %s: %d GPU(s)%s, pool generation %d", base,
                 len(specs[""]["devices"]),
                 f", {mig} MIG placement(s) in {len(specs) - 1} more slice(s)" if mig else "",
                 generation)

    def plugin_config(self, cdi_dir: Path) -> PluginConfig:
        """The node as the kubelet plugin prepares claims on it (tessera.node.draplugin): the
        GPUs NVML lists, the headroom, the directories; ``not_ready`` while shares cannot be
        enforced here."""
        gpus = self.inventory.gpus if self.inventory is not None else []
        return PluginConfig(
            node=self.opts.node_name, uuids={g.index: g.uuid for g in gpus}, cdi_dir=cdi_dir,
            library_dir=self.opts.library_dir, library_mount=self.opts.library_mount,
            claims_dir=self.opts.containers_dir / CLAIMS_SUBDIR,
            claims_host_dir=self.opts.containers_host_dir / CLAIMS_SUBDIR,
            loans_host_dir=self.opts.loans_dir,  # the chart mounts it at its host path
            headroom={h.uuid: h.bytes for h in self.headroom.values()},
            not_ready="" if self.ready else (self.reason or "starting"), mig=self.mig,
            memory={g.uuid: g.memory_total for g in gpus})

    # ---- pods -------------------------------------------------------------------------------
    async def _list_pods(self) -> None:
        pods: dict[tuple[str, str], PodView] = {}
        async for pod in self.client.list(Pod, namespace="*",
                                          fields={"spec.nodeName": self.opts.node_name}):
            v = pod_view(pod)
            pods[(v.namespace, v.name)] = v
        self.pods = pods
        self.listed = True

    async def watch_pods(self) -> None:
        while True:
            try:
                await self._list_pods()
                self.wake.set()
                async for kind, pod in self.client.watch(
                        Pod, namespace="*", fields={"spec.nodeName": self.opts.node_name}):
                    v = pod_view(pod)
                    if kind == "DELETED":
                        self.pods.pop((v.namespace, v.name), None)
                    else:
                        self.pods[(v.namespace, v.name)] = v
                    self.wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("pod watch: %r; relisting", exc)
                await asyncio.sleep(0.5)

    async def post_event(self, namespace: str, name: str, uid: str, kind: str, reason: str,
                         message: str, warning: bool = True) -> None:
        dedup = (uid or name, reason, message)
        if dedup in self.posted:
            self.posted.move_to_end(dedup)
            return
        self.posted[dedup] = None
        while len(self.posted) > POSTED_MAX:
            self.posted.popitem(last=False)
        obj = codecs.from_dict(wire.event_body(
            kind=kind, name=name, namespace=namespace, uid=uid, reason=reason, message=message,
            type_="Warning" if warning else "Normal", component=COMPONENT,
            instance=self.opts.node_name, host=self.opts.node_name))
        try:
            await self.client.create(obj)
        except Exception as exc:
            log.warning("event %s on %s/%s: %r", reason, namespace, name, exc)
            self.posted.pop(dedup, None)

    # ---- reservation pods: which GPU each got -------------------------------------------------
    async def report_gpu_uuids(self) -> None:
        pending = [p for p in self.pods.values()
                   if p.labels.get(wire.RESERVATION_LABEL) == "true" and not p.deleting
                   and not p.annotations.get(wire.GPU_UUID)]
        if not pending or self.inventory is None:
            return
        try:
            devices = await asyncio.to_thread(list_devices, self.opts.pod_resources_socket)
        except PodResourcesError as exc:
            log.warning("%s", exc)
            return
        assigned = gpus_by_pod(devices)
        by_index = {str(g.index): g.uuid for g in self.inventory.gpus}
        known = {g.uuid for g in self.inventory.gpus}
        for p in pending:
            ids = assigned.get((p.namespace, p.name))
            if not ids:
                continue  # the kubelet has not admitted it yet
            device_id = ids[0]
            uuid = device_id if device_id in known else by_index.get(device_id)
            if uuid is None:
                await self.post_event(p.namespace, p.name, p.uid, "Pod", "UnknownGPU",
                                      f"the device plugin gave device {device_id!r}, which NVML "
                                      f"on node {self.opts.node_name} does not list")
                continue
            try:
                await self.client.patch(Pod, p.name, {"metadata": {"annotations": {wire.GPU_UUID: uuid}}},
                                        namespace=p.namespace, patch_type=PatchType.MERGE)
                p.annotations[wire.GPU_UUID] = uuid
                self.uuids_written += 1
                log.info("reservation pod %s/%s holds %s", p.namespace, p.name, uuid)
            except ApiError as exc:
                if exc.status.code != 404:
                    log.warning("annotating %s/%s: %s", p.namespace, p.name, exc.status.message)

    # ---- share pods: their isolation files ---------------------------------------------------
    def context_overhead(self, share: Share) -> int:
        """What the library charges per CUDA context in this share: its GPUs' headroom."""
        by_uuid = {h.uuid: h.bytes for h in self.headroom.values()}
        return max((by_uuid.get(d.uuid, 0) for d in share.devices), default=0)

    async def write_share_files(self) -> dict[str, Share]:
        shares: dict[str, Share] = {}
        known = {g.uuid for g in self.inventory.gpus} if self.inventory else set()
        known |= {str(part["uuid"]) for parts in self.mig_parts.values() for part in parts
                  if part.get("uuid")}  # partitions serving shares (docs/mig.md)
        for p in list(self.pods.values()):
            if p.deleting:
                continue
            try:
                share = share_of(p, self.opts.containers_host_dir, self.mig_written.get(p.uid))
                if share is None:
                    continue
                missing = [d.uuid for d in share.devices if d.uuid not in known]
                if missing:
                    raise ShareFilesError(
                        f"its GPU(s) {', '.join(missing)} are not on node {self.opts.node_name} "
                        f"(NVML lists {', '.join(sorted(known)) or 'none'}); not started uncapped")
                if not self.ready:
                    raise ShareFilesError(f"node {self.opts.node_name} is not ready for GPU "
                                          f"shares: {self.reason}")
                files.write_share(self.opts.containers_dir, share, self.context_overhead(share),
                                  loans_dir=self.opts.loans_dir)
                shares[share.key] = share
                if self.share_errors.pop(p.uid, None) is not None:  # fixed: if it recurs, say so
                    for seen in [k for k in self.posted if k[0] == p.uid]:
                        del self.posted[seen]
            except (ShareFilesError, InvalidRequest) as exc:
                msg = str(exc)
                if self.share_errors.get(p.uid) != msg:
                    self.share_errors[p.uid] = msg
                    log.warning("pod %s/%s: %s", p.namespace, p.name, msg)
                await self.post_event(p.namespace, p.name, p.uid, "Pod", "GPUIsolationFailed", msg)
        if self.listed:
            keep = {p.annotations.get(wire.GPU_CONFIG_KEY, "") for p in self.pods.values()}
            for key in files.remove_stale(self.opts.containers_dir, keep):
                log.info("removed the isolation files of a pod that is gone (%s)", key)
        return shares

    # ---- usage, metrics, escapes, plugin (tessera.node.observe) ------------------------------
    def _sink(self, share: Share | None, reason: str, message: str, warning: bool) -> None:
        if share is None:
            coro = self.post_event("", self.opts.node_name, "", "Node", reason, message, warning)
        else:
            coro = self.post_event(share.namespace, share.pod, share.uid, "Pod", reason, message,
                                   warning)
        task = asyncio.get_running_loop().create_task(coro)
        self._event_tasks.add(task)
        task.add_done_callback(self._event_tasks.discard)

    # ---- MIG pods: their partitions (tessera.node.kube_mig, docs/mig.md) --------------------
    async def sync_mig(self) -> None:
        if self.mig is None or not self.listed:
            return
        wants: list[Want] = []
        for p in list(self.pods.values()):
            if p.finished:
                continue
            try:
                w = want_of(p.namespace, p.name, p.uid, p.annotations)
            except MigError as exc:
                await self.post_event(p.namespace, p.name, p.uid, "Pod", "MIGPartitionFailed",
                                      str(exc))
                continue
            if w is not None:
                wants.append(w)
        try:
            now = time.monotonic()
            outcomes = self.mig.sync(wants, frozenset(
                u for u, (_, until) in self.mig_failed.items() if until > now))
            self.mig_states = self.mig.state()
            self.mig_wants = wants
            self.mig_parts = partitions_doc(self.mig_states)
        except Exception as exc:  # NVML failing now: the rest of the sync goes on
            log.warning("MIG partitions not synced: %r", exc)
            return
        live = {w.uid for w in wants}
        for table in (self.mig_written, self.mig_failed):
            for uid in [u for u in table if u not in live]:
                del table[uid]
        for o in outcomes:
            await self._mig_outcome(o)

    async def _mig_outcome(self, o: Outcome) -> None:
        w = o.want
        if o.uuid is None:
            count = self.mig_failed.get(w.uid, (0, 0.0))[0] + 1
            self.mig_failed[w.uid] = (count, time.monotonic() + min(60.0, 2.0 ** (count - 1)))
            log.warning("pod %s/%s: MIG %s: %s", w.namespace, w.name, w.profile, o.error)
            await self.post_event(w.namespace, w.name, w.uid, "Pod", "MIGPartitionFailed",
                                  f"MIG {w.profile} on GPU {w.gpu} at memory slot {w.start}: "
                                  f"{o.error}")
            return
        self.mig_failed.pop(w.uid, None)
        if self.mig_written.get(w.uid) == o.uuid:
            return
        pod = self.pods.get((w.namespace, w.name))
        cm = pod.annotations.get(wire.CONFIGMAP) if pod is not None else None
        if not cm:
            return
        try:
            await self.client.patch(ConfigMap, cm, {"data": {
                wire.VISIBLE_DEVICES_KEY: o.uuid, wire.MIG_UUID_KEY: o.uuid}},
                namespace=w.namespace, patch_type=PatchType.MERGE)
        except ApiError as exc:
            log.warning("ConfigMap %s/%s of MIG pod %s: %s", w.namespace, cm, w.name,
                        exc.status.message)
            return
        self.mig_written[w.uid] = o.uuid
        log.info("pod %s/%s: MIG %s %s", w.namespace, w.name, w.profile, o.uuid)

    async def sync_once(self) -> None:
        self.follow_mig_modes()
        await self.sync_mig()
        await self.publish_node()
        if time.monotonic() >= self.slice_retry_at:
            try:
                await self.publish_slice()
                self.slice_error = ""
            except (ApiError, OSError, ValueError) as exc:
                # No DRA API (an older cluster), RBAC without resourceslices, a slice the API
                # server refuses: shares by annotation still work, so this never stops the sync.
                msg = str(getattr(getattr(exc, "status", None), "message", "") or exc)
                if msg != self.slice_error:
                    log.warning("ResourceSlice for node %s not written (retried every %d s): "
                                "%s", self.opts.node_name, SLICE_RETRY_SECONDS, msg)
                self.slice_error = msg
                self.slice_retry_at = time.monotonic() + SLICE_RETRY_SECONDS
        await self.report_gpu_uuids()
        shares = await self.write_share_files()
        self.shares = shares
        self.observer.inventory = self.inventory
        self.observer.nvml = self.nvml
        self.usage = self.observer.observe(shares)
        self.syncs += 1

    async def run(self) -> None:
        self.prepare()
        self.collector.ready = self.ready
        if self.nvml is None:
            print(f"tessera-node: {self.nvml_error}; node {self.opts.node_name} is not ready for "
                  "GPU shares (metrics are still served)", flush=True)
        watcher = asyncio.create_task(self.watch_pods())
        try:
            while True:
                try:
                    await self.sync_once()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("sync failed: %r", exc)
                    self.published = None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), self.opts.sync_interval)
                self.wake.clear()
        finally:
            watcher.cancel()


def make_client(kubeconfig: str | None) -> AsyncClient:
    config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    return AsyncClient(config, timeout=None, field_manager=COMPONENT)

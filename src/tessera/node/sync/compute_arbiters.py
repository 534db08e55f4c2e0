"""Sync step: the compute share's arbiters (issue 30; docs/compute-share.md,
:mod:`tessera.node.compute_arbiters`). Runs before the share files: each share pod with a compute
share gets its entry in its GPUs' arbiters, and the text of its ``gpu-compute.conf``
(``node.compute_conf``), which the share-files step writes into the container's config directory
in the same rename that lets the kubelet start the container. A share whose arbiter cannot be
set up is named in ``node.compute_errors``: the share-files step then writes none of its files
(fail closed: the container cannot start ungated) and posts the reason as an Event."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tessera import wire
from tessera.core.errors import InvalidRequest
from tessera.node.compute_arbiters import ComputeArbiters, ComputeSetupError, entry_of
from tessera.node.containers import ShareFilesError
from tessera.node.sync.base import NodeContext, SyncStep
from tessera.node.sync.share_files import share_of

log = logging.getLogger("tessera.node")


LABELS = ["node", "namespace", "pod", "workload", "project", "gpu_uuid"]


class ComputeArbitersStep(SyncStep):
    name = "compute-arbiters"

    def __init__(self) -> None:
        self.arbiters: ComputeArbiters | None = None
        self.who: dict[str, tuple[str, str, str, str]] = {}
        """Share key -> (namespace, pod, workload, project), this sync's, for the metrics."""
        self.node_name = ""

    def metrics(self) -> Iterator[Metric]:
        """Per pod and GPU, the GPU time the arbiter charged (docs/compute-share.md, docs/metrics.md)."""
        total = CounterMetricFamily("tessera_workload_gpu_time_seconds",
                                    "GPU time the compute arbiter charged the pod on this GPU", labels=LABELS)
        share = GaugeMetricFamily("tessera_workload_gpu_time_share",
                                  "Part of the GPU's time the pod was charged over the window",
                                  labels=[*LABELS, "window"])
        request = GaugeMetricFamily("tessera_workload_gpu_compute_request",
                                    "The pod's compute request on this GPU", labels=LABELS)
        limit = GaugeMetricFamily("tessera_workload_gpu_compute_limit",
                                  "The pod's compute limit on this GPU", labels=LABELS)
        for uuid, entries in (self.arbiters.usage() if self.arbiters else {}).items():
            for u in entries:
                who = self.who.get(u.key)
                if who is None:
                    continue
                labels = [self.node_name, *who, uuid]
                total.add_metric(labels, u.total_seconds)
                share.add_metric([*labels, "1s"], u.share_1s)
                share.add_metric([*labels, "10s"], u.share_10s)
                request.add_metric(labels, u.request)
                limit.add_metric(labels, u.limit)
        yield from (total, share, request, limit)

    def share_fields(self) -> dict[tuple[str, str, str], dict[str, Any]]:
        """Per (GPU, namespace, pod), the GPU time the arbiter charged, for ``/usage`` (the
        console's GPUs and workload pages: tessera.node.report, tessera.api.usage)."""
        out: dict[tuple[str, str, str], dict[str, Any]] = {}
        for uuid, entries in (self.arbiters.usage() if self.arbiters else {}).items():
            for u in entries:
                who = self.who.get(u.key)
                if who is not None:
                    out[(uuid, who[0], who[1])] = {
                        "gpuTime1s": round(u.share_1s, 4), "gpuTime10s": round(u.share_10s, 4),
                        "gpuSecondsTotal": round(u.total_seconds, 3), "computeRequest": round(u.request, 6),
                        "computeLimit": round(u.limit, 6), "computeEnforced": not u.multi_gpu}
        return out

    async def sync(self, node: NodeContext) -> None:
        opts = node.opts
        if self.arbiters is None:
            self.arbiters = ComputeArbiters(opts.loans_dir)
            self.node_name = opts.node_name
            if node.observer is not None:
                node.observer.collector.extra.append(self.metrics)
                node.observer.collector.share_fields.append(self.share_fields)
        who: dict[str, tuple[str, str, str, str]] = {}
        confs: dict[str, str] = {}
        errors: dict[str, str] = {}
        for p in list(node.pods.values()):
            if p.deleting or wire.GPU_CONFIG_KEY not in p.annotations:
                continue
            try:
                share = share_of(p, opts.containers_host_dir, node.mig.written.get(p.uid))
                if share is None:
                    continue
                entry = entry_of(share.key, [d.uuid for d in share.devices], p.annotations,
                                 share.priority_class)
                if entry is not None:
                    confs[share.key] = self.arbiters.apply(entry)
                    who[share.key] = (share.namespace, share.pod, share.workload, share.project)
            except ShareFilesError:
                continue  # the share-files step says what is wrong with the pod
            except (ComputeSetupError, InvalidRequest) as exc:
                key = p.annotations[wire.GPU_CONFIG_KEY]
                errors[key] = f"compute share: {exc}"
                log.warning("pod %s/%s: %s", p.namespace, p.name, errors[key])
        if node.listed:
            live = {p.annotations.get(wire.GPU_CONFIG_KEY, "") for p in node.pods.values() if not p.deleting}
            for key in self.arbiters.forget_gone(live):
                log.info("removed the compute arbiter entry of a pod that is gone (%s)", key)
        self.who = who
        node.compute_conf = confs
        node.compute_errors = errors

    def failed(self) -> None:
        if self.arbiters is not None:
            self.arbiters.written.clear()  # rewrite every entry at the next sync

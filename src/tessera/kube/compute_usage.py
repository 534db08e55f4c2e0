"""The compute share's measured GPU time on a Kubernetes workload's document (issue 30;
docs/compute-share.md): the console's workload page and ``describe`` show, per GPU, the time the
node's arbiter charged each of the workload's pods over 1 s and 10 s, as embedded mode does
(:mod:`tessera.local.compute_view`).

tessera-node puts it in its ``/usage`` shares (:mod:`tessera.node.report`); the API server's
poller already holds each node's last report (:mod:`tessera.kube.agent_usage`), so this only
joins: no request waits on an agent."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.api.usage import NodeReport


def add_gpu_time(doc: dict[str, Any], reports: Mapping[str, NodeReport]) -> dict[str, Any]:
    """Fills ``doc["computeShare"]["gpus"]`` (in place) from the node reports: one entry per pod
    and GPU the node's arbiter charged, ``gpuTime1s``/``gpuTime10s`` (part of the GPU's time),
    ``gpuSecondsTotal`` and ``enforced``; adds the figures to the share's ``text``. Returns doc."""
    share = doc.get("computeShare")
    if share is None:
        return doc
    gpus = []
    for pod in doc.get("pods") or []:
        report = reports.get(pod.get("nodeName") or "")
        if report is None or report.state != "ok":
            continue
        who = f"{pod.get('namespace')}/{pod.get('name')}"
        for (uuid, key), sh in sorted(report.shares.items()):
            if key == who and "gpuTime1s" in sh:
                gpus.append({"gpu": uuid, "pod": pod.get("name"),
                             "gpuTime1s": sh["gpuTime1s"], "gpuTime10s": sh.get("gpuTime10s"),
                             "gpuSecondsTotal": sh.get("gpuSecondsTotal"),
                             "enforced": sh.get("computeEnforced", True)})
    share["gpus"] = gpus
    if gpus:
        share["text"] += "; GPU time " + ", ".join(
            f"{g['gpuTime1s']:.2f} (1 s) {g['gpuTime10s'] or 0:.2f} (10 s)" for g in gpus)
    return doc

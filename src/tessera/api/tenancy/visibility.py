"""Documents cut to what a caller may see: the cluster's GPUs keep their numbers (memory
allocated, so a researcher sees how full a GPU is) but a workload of a project the caller cannot
read loses its name, pod and project."""

from __future__ import annotations

from typing import Any


def redact_cluster(doc: dict[str, Any], visible: frozenset[str] | None) -> dict[str, Any]:
    if visible is None:
        return doc
    for node in doc.get("nodes", []):
        for gpu in node.get("gpus", []):
            gpu["workloads"] = [w if w.get("project") in visible else
                                {**{k: v for k, v in w.items()
                                    if k not in ("name", "project", "pod")},
                                 "name": "", "project": "", "hidden": True}
                                for w in gpu.get("workloads", [])]
        for gpu in node.get("migGpus", []):
            for part in gpu.get("partitions", []):
                if part.get("workload") is not None and part.get("project") not in visible:
                    part["workload"] = "(hidden)"
                    part["project"] = ""
    return doc


def redact_overview(doc: dict[str, Any], visible: frozenset[str] | None) -> dict[str, Any]:
    """The Overview's per-project rows only for readable projects (totals stay: GPUs)."""
    if visible is not None:
        doc["projects"] = [p for p in doc.get("projects", []) if p.get("name") in visible]
    return doc


def redact_history(doc: dict[str, Any], visible: frozenset[str] | None) -> dict[str, Any]:
    """The history's per-project and per-workload (``project/name``) series only for readable
    projects; the cluster's totals stay."""
    if visible is None:
        return doc

    def keep(series: dict[str, Any], workloads: bool) -> dict[str, Any]:
        return {k: v for k, v in series.items()
                if (k.split("/", 1)[0] if workloads else k) in visible}

    doc["projects"] = keep(doc.get("projects", {}), False)
    doc["workloads"] = keep(doc.get("workloads", {}), True)
    util = doc.get("utilization", {})
    util["projects"] = keep(util.get("projects", {}), False)
    util["workloads"] = keep(util.get("workloads", {}), True)
    mem = doc.get("memoryUsed", {})
    mem["projects"] = keep(mem.get("projects", {}), False)
    return doc

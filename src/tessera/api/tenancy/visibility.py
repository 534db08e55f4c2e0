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
                if part.get("workload") is not None:
                    part["workload"] = "(hidden)"
    return doc

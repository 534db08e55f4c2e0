"""Embedded mode's API documents: a workload, its pods, a project, the machine."""

from __future__ import annotations

import shlex
import time
from typing import Any

from tessera.api.fair_share_doc import fair_share_status
from tessera.api.models import compute_doc
from tessera.core.cycle import ProjectStatus
from tessera.core.model import Node
from tessera.core.request_text import devices_text, mig_placement_text, request_text
from tessera.core.requests import gpu_request_from_dict
from tessera.local.records import PodPhase, PodRecord
from tessera.local.store import Project, Workload


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def pod_doc(p: PodRecord) -> dict[str, Any]:
    return {
        "index": p["index"],
        "phase": p.get("phase"),
        "nodeName": p["node"],
        "gpuDevices": [
            {"index": d, "uuid": u, "requestBytes": r, "limitBytes": lim}
            for d, u, r, lim in zip(
                p["devices"], p["uuids"], p["requestBytes"], p["limitBytes"], strict=True
            )
        ],
        "exclusive": p["exclusive"],
        "migDevice": p.get("mig"),
        "gpuPlacement": (mig_placement_text(p["mig"]) if p.get("mig") else devices_text(
            [{"index": d, "requestBytes": r, "limitBytes": lim} for d, r, lim in zip(
                p["devices"], p["requestBytes"], p["limitBytes"], strict=True)],
            p["exclusive"])),
        "pid": p.get("pid"),
        "exitCode": p.get("exitCode"),
        "logPath": p.get("log"),
        "env": p.get("env", {}),
        "container": p.get("env", {}).get("TESSERA_CONTAINER"),
    }


def workload_doc(w: Workload, simulated: bool, isolation: str, scheduler: str,
                 brief: bool = False) -> dict[str, Any]:
    """A workload as the API shows it; ``brief``: the listing's fields only (the same keys as
    ``store.BRIEF_FIELDS``)."""
    gpu = gpu_request_from_dict(w.request)
    mig = w.control.mig_profile
    compute = {"gpuMigProfile": mig} if mig else compute_doc(gpu)
    out: dict[str, Any] = {
        "workloadId": w.id,
        "name": w.name,
        "requestedName": w.name,
        "type": w.type,
        "projectId": str(w.project_id),
        "projectName": w.project_name,
        "phase": w.phase,
        "phaseMessage": w.phase_message,
        "createdAt": iso(w.created),
        "startedAt": iso(w.started) if w.started else None,
        "pendingSince": iso(w.control.pending_since or w.created),
        "completedAt": iso(w.completed) if w.completed else None,
        "exitCode": w.exit_code,
        "priorityClass": w.priority_class,
        "preemptible": w.preemptible,
        "nodeName": w.node or None,
        "gpuDevices": w.devices,
        "workers": w.workers,
        "minWorkers": w.min_workers,
        "runningPods": sum(1 for p in w.pods if p.get("phase") == PodPhase.RUNNING),
        "gpus": {
            "requested": round(w.gpus_requested, 4),
            "allocated": round(w.gpus_allocated, 4),
            "request": request_text(gpu, w.workers, mig),
        },
        "simulated": simulated,
        "image": w.spec.get("image") or "",
        "serviceUrls": list(w.control.service_urls),
    }
    if brief:
        return out
    spec = dict(w.spec)  # the user's, as given (the loop's own state is w.control)
    argv = w.control.argv
    spec["command"] = argv[0] if argv else ""
    spec["args"] = shlex.join(argv[1:])
    spec["environmentVariables"] = [
        {"name": k, "value": v} for k, v in w.control.env.items()
    ]
    spec["compute"] = compute
    out["spec"] = spec
    out["pods"] = [pod_doc(p) for p in w.pods]
    out["isolation"] = isolation
    out["scheduler"] = scheduler
    return out


def project_doc(p: Project, allocated: float, cycle: ProjectStatus | None = None) -> dict[str, Any]:
    """``cycle``: the project's status after the last scheduling cycle (its fair share and how
    much of it usage history gave or took, docs/scheduling.md)."""
    status: dict[str, Any] = {"allocated": {"gpu": round(allocated, 4)}}
    if cycle is not None:
        status.update(fair_share_status(cycle))
    return {
        "id": str(p.id),
        "name": p.name,
        "resources": {
            "gpu": {
                "deserved": p.deserved,
                "limit": p.limit,
                "overQuotaWeight": p.over_quota_weight,
            }
        },
        "priority": p.priority,
        "status": status,
        "createdAt": iso(p.created),
    }


def node_doc(node: Node, held: list[tuple[str, str, PodRecord]]) -> dict[str, Any]:
    """The machine's GPUs and who holds what on each; ``held``: (workload name, project, pod
    record) for every pod holding GPUs. Each share names its pod as ``PROJECT/NAME-INDEX``, the
    name the usage reader gives it (tessera.local.usage)."""
    used: dict[int, list[dict[str, Any]]] = {g.index: [] for g in node.gpus}
    for name, project, pod in held:
        for d, b in zip(pod["devices"], pod["requestBytes"], strict=True):
            used[d].append({"name": name, "project": project,
                            "pod": f"{project}/{name}-{pod['index']}", "bytes": b,
                            "exclusive": pod["exclusive"]})
    gpus = []
    for g in node.gpus:
        tenants = used[g.index]
        gpus.append({
            "index": g.index,
            "uuid": g.uuid,
            "model": g.model,
            "product": g.product,
            "memoryBytes": g.memory,
            "headroomBytes": g.headroom,
            "allocatedBytes": sum(t["bytes"] for t in tenants),
            "workloads": tenants,
        })
    return {"name": node.name, "gpus": gpus}

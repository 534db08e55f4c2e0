"""GPU memory used, loans and utilisation, as the node agents report them, joined to the
cluster's document (``GET /api/v1/cluster``) for both backends.

Each backend has a :class:`UsageSource` that answers at once from what it last read — embedded
mode reads NVML in the server's process (:mod:`tessera.local.usage`), the Kubernetes backend
polls each node's agent (:mod:`tessera.kube.agent_usage`) — so a request never waits for a GPU
or an agent. :func:`merge` adds to the document:

- on each node, ``agent``: ``{state, message, ageSeconds}``; ``state`` is ``ok``, ``unreachable``
  (the agent did not answer: no numbers are shown rather than zeros), ``no-agent`` (no agent
  published an address), ``not-ready`` (it answered without usage, e.g. no NVML), ``waiting``
  (not asked yet) or ``simulated`` (no GPU to read);
- on each GPU where the agent reported it: ``usedBytes`` (NVML), ``utilization`` (0 to 1),
  ``loanedBytes`` (what dynamic fractions hold above their requests);
- on each share: ``usedBytes`` (NVML, its processes), ``chargedBytes`` (the isolation library),
  ``loanedBytes`` and ``utilization`` (its processes' SM utilisation, 0 to 1; a whole GPU: the
  GPU's).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

STATES = ("ok", "unreachable", "no-agent", "not-ready", "waiting", "simulated")


@dataclass(frozen=True)
class NodeReport:
    node: str
    state: str
    message: str
    time: float
    """When the report was read (or the failure seen)."""
    document: dict[str, Any] | None = None
    """The agent's ``/usage`` document (:mod:`tessera.node.report`), when ``state`` is ok."""
    gpus: dict[str, dict[str, Any]] = field(default_factory=dict)
    """uuid -> the fields :func:`merge` sets on that GPU (checked once, when the report came)."""
    shares: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """(gpu uuid, ``namespace/pod``) -> the fields :func:`merge` sets on that share."""


class UsageSource(Protocol):
    def reports(self) -> dict[str, NodeReport]:
        """The latest report per node, at once (never waits for an agent or NVML)."""
        ...


def report_of(node: str, document: Any, now: float | None = None) -> NodeReport:
    """A node's report from what its agent answered (checked: a malformed answer is a failure,
    not a crash)."""
    now = time.time() if now is None else now
    if not isinstance(document, dict):
        return NodeReport(node, "unreachable", "the agent's /usage answer is not a JSON object",
                          now)
    gpus = document.get("gpus")
    if gpus is None:
        return NodeReport(node, "not-ready", str(document.get("message") or
                                                 "the agent reports no GPU usage"), now)
    if not isinstance(gpus, list) or not isinstance(document.get("shares", []), list) or not all(
            isinstance(g, dict) for g in gpus):
        return NodeReport(node, "unreachable", "the agent's /usage answer is malformed", now)
    return NodeReport(node, "ok", "", now, document, *_index(document))


def _index(document: dict[str, Any]) -> tuple[dict[str, dict[str, Any]],
                                              dict[tuple[str, str], dict[str, Any]]]:
    """What a request joins, built once per report: a page of 500 nodes then only looks up."""
    gpus: dict[str, dict[str, Any]] = {}
    for g in document.get("gpus") or []:
        used = _number(g.get("memoryUsedBytes"))
        fields: dict[str, Any] = {"utilization": _number(g.get("utilization"))}
        if used is not None:
            fields["usedBytes"] = int(used)
        gpus[str(g.get("uuid"))] = fields
    shares: dict[tuple[str, str], dict[str, Any]] = {}
    for sh in document.get("shares") or []:
        if not isinstance(sh, dict):
            continue
        out: dict[str, Any] = {"utilization": _number(sh.get("smUtilization"))}
        for key in ("usedBytes", "chargedBytes", "loanedBytes"):
            v = _number(sh.get(key))
            if v is not None:
                out[key] = int(v)
        for key in COMPUTE_FIELDS:  # the compute arbiter's GPU time (docs/compute-share.md)
            v = _number(sh.get(key))
            if v is not None:
                out[key] = v
        if isinstance(sh.get("computeEnforced"), bool):
            out["computeEnforced"] = sh["computeEnforced"]
        shares[(str(sh.get("gpuUuid")), f"{sh.get('namespace')}/{sh.get('pod')}")] = out
    return gpus, shares


COMPUTE_FIELDS = ("gpuTime1s", "gpuTime10s", "gpuSecondsTotal", "computeRequest", "computeLimit")
"""A compute share's fields in an agent's /usage shares (tessera.node.report), passed on."""


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def merge(cluster: dict[str, Any], reports: dict[str, NodeReport],
          now: float | None = None) -> dict[str, Any]:
    """Adds the reports to the cluster document (in place; returned for convenience)."""
    now = time.time() if now is None else now
    for node in cluster.get("nodes", []):
        r = reports.get(node["name"])
        if r is None:
            node["agent"] = {"state": "waiting", "message": "no report from this node's agent "
                             "yet", "ageSeconds": None}
            continue
        node["agent"] = {"state": r.state, "message": r.message,
                         "ageSeconds": round(max(0.0, now - r.time), 1)}
        if r.state != "ok":
            continue
        for g in node.get("gpus", []):
            uuid = g.get("uuid")
            u = r.gpus.get(uuid)
            if u is None:
                continue
            g.update(u)
            loaned = 0
            for w in g.get("workloads", []):
                if w.get("exclusive"):
                    w["usedBytes"] = u.get("usedBytes")
                    w["utilization"] = u["utilization"]
                    continue
                sh = r.shares.get((uuid, w.get("pod", "")))
                if sh is not None:
                    w.update(sh)
                    loaned += sh.get("loanedBytes", 0)
            g["loanedBytes"] = loaned
    return cluster


@dataclass(frozen=True)
class Busy:
    """Utilisation and memory in use, summed from a merged cluster document. ``known``: some
    node reported usage (else every figure is absent, not 0)."""

    known: bool
    gpus_busy: float
    """GPUs' worth of utilisation: the sum of every reporting GPU's utilisation (0 to 1 each)."""
    memory_used: int
    memory_loaned: int
    workloads_busy: dict[tuple[str, str], float]
    """(project, workload) -> GPUs' worth of its processes' utilisation."""
    workloads_used: dict[tuple[str, str], int]
    """(project, workload) -> bytes its processes use (NVML)."""


def busy(cluster: dict[str, Any]) -> Busy:
    known = False
    gpus_busy = 0.0
    used = loaned = 0
    w_busy: dict[tuple[str, str], float] = {}
    w_used: dict[tuple[str, str], int] = {}
    for node in cluster.get("nodes", []):
        if (node.get("agent") or {}).get("state") != "ok":
            continue
        known = True
        for g in node.get("gpus", []):
            gpus_busy += float(g.get("utilization") or 0.0)
            used += int(g.get("usedBytes") or 0)
            loaned += int(g.get("loanedBytes") or 0)
            for w in g.get("workloads", []):
                key = (str(w.get("project") or ""), str(w.get("name") or ""))
                if w.get("utilization") is not None:
                    w_busy[key] = w_busy.get(key, 0.0) + float(w["utilization"])
                if w.get("usedBytes") is not None:
                    w_used[key] = w_used.get(key, 0) + int(w["usedBytes"])
    return Busy(known, gpus_busy, used, loaned, w_busy, w_used)

"""Prometheus metrics of tessera-scheduler and tessera-webhook (docs/metrics.md).

Each process exports only its own registry: the scheduler serves :data:`SCHEDULER` on its health
port (``/metrics`` beside ``/healthz``), the webhook serves :data:`WEBHOOK` on its HTTPS port.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

SCHEDULER = CollectorRegistry()
CYCLE_SECONDS = Histogram(
    "tessera_scheduler_cycle_duration_seconds", "one scheduling cycle: snapshot, plan, apply",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=SCHEDULER)
BINDINGS = Counter("tessera_scheduler_bindings", "pods bound to a node", registry=SCHEDULER)
BINDING_FAILURES = Counter("tessera_scheduler_binding_failures",
                           "bindings that failed (retried with back-off)", registry=SCHEDULER)
GANG_ABORTS = Counter("tessera_scheduler_gang_member_aborts",
                      "gang members not bound because another member of the gang could not be",
                      registry=SCHEDULER)
EVICTIONS = Counter("tessera_scheduler_evictions", "pods evicted, by reason", ["reason"],
                    registry=SCHEDULER)
PENDING = Gauge("tessera_scheduler_pending_pods", "pods waiting to be placed, by reason",
                ["reason"], registry=SCHEDULER)
RETRIES = Counter("tessera_scheduler_api_write_retries",
                  "API writes retried after a transient error (409, 429, 5xx, timeouts)",
                  registry=SCHEDULER)

WEBHOOK = CollectorRegistry()
ADMISSION_SECONDS = Histogram(
    "tessera_webhook_admission_duration_seconds", "time to answer one AdmissionReview",
    ["operation"], buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
    registry=WEBHOOK)
REFUSALS = Counter("tessera_webhook_refusals", "admission requests refused, by the field's rule",
                   ["operation", "field"], registry=WEBHOOK)

PENDING_REASONS = ("quota", "no-fit", "constraints", "node-not-ready", "gang", "other")


def pending_reason(message: str) -> str:
    """The reason class of a waiting pod's message (bounded label values)."""
    m = message.lower()
    if "tessera-node" in m or "not ready" in m:
        return "node-not-ready"
    if "nodes are available" in m or "didn't match" in m or "taint" in m:
        return "constraints"
    if "quota" in m or "fair share" in m or "limit" in m:
        return "quota"
    if "gang" in m or "members" in m:
        return "gang"
    if "no gpu" in m or "free" in m or "room" in m or "fit" in m:
        return "no-fit"
    return "other"


def set_pending(messages: Iterable[str]) -> None:
    counts = Tally(pending_reason(m) for m in messages)
    for reason in PENDING_REASONS:
        PENDING.labels(reason).set(counts.get(reason, 0))


def refusal_field(field: str) -> str:
    """A bounded label for the field a refusal names (its first 60 characters, no values)."""
    return (field.split(" ", 1)[0] or "unknown")[:60]

"""``GET /api/v1/reports/usage``: GPU-hours allocated and used per project, department, user or
workload over a time range (docs/accounting.md), and their Prometheus counters."""

import time
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from tessera.api.tenancy.audit import parse_time
from tessera.api.tenancy.guard import principal_of
from tessera.api.tenancy.ledger import Ledger, retention_days
from tessera.api.tenancy.service import Tenancy
from tessera.core.errors import InvalidRequest


def check_range(since: float, until: float, now: float) -> None:
    if since > until:
        raise InvalidRequest("from", "must not be after to")
    days = retention_days()
    if since < now - days * 86400 or until - since > days * 86400:
        raise InvalidRequest("from", f"reaches beyond the accounting retention of {days:g} days "
                             "(TESSERA_ACCOUNTING_RETENTION_DAYS)")


def mount_reports(api: APIRouter, tenancy: Tenancy, ledger: Ledger,
                  project_names: Callable[[], list[str]]) -> None:
    @api.get("/reports/usage", tags=["reports"])
    def usage(
        request: Request,
        start: Annotated[str, Query(alias="from", description="ISO 8601 start")],
        end: Annotated[str, Query(alias="to", description="ISO 8601 end")],
        by: Annotated[Literal["project", "department", "user", "workload"], Query()] = "project",
    ) -> dict[str, Any]:
        """GPU-hours *allocated* (from bindings: whole GPUs, fractions, MIG partitions by their
        fraction; suspended or pending time not counted) and *used* (measured, where a node
        agent reported it) per ``by`` key, over the projects the caller may read."""
        now = time.time()
        since, until = parse_time(start, "from", 0.0), parse_time(end, "to", now)
        check_range(since, until, now)
        visible = tenancy.authz.visible(principal_of(request), "reports:read", project_names())
        rows = ledger.report(since, until, by, now,
                             None if visible is None else frozenset(visible))
        return {"from": start, "to": end, "by": by, "rows": rows}


class AccountingCollector(Collector):
    """``tessera_gpu_hours_allocated_total`` and ``tessera_gpu_hours_used_total``
    ``{project,department}``: GPU-hours allocated and measured used since the ledger began (the
    same numbers as the report, so Grafana can show them)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily("tessera_gpu_hours_allocated",
                                     "GPU-hours allocated to workloads (bindings x time)",
                                     labels=["project", "department"])
        used = CounterMetricFamily("tessera_gpu_hours_used",
                                   "GPU-hours workloads used (GPU time measured by the node "
                                   "agents and compute arbiters)", labels=["project", "department"])
        for project, department, hours, used_hours in self.ledger.totals():
            family.add_metric([project, department], max(hours, 0.0))
            if used_hours is not None:
                used.add_metric([project, department], max(used_hours, 0.0))
        yield family
        yield used

"""Per-workload GPU time from the compute arbiters (docs/compute-share.md, docs/metrics.md); registered by the embedded backend (Control.metrics_collectors).

The metric the field lacks (NVML has no per-process utilisation on a shared GPU): the GPU time
each workload's arbiter charged it, per GPU, next to its request and limit.

* ``tessera_workload_gpu_time_seconds_total{workload,gpu}``: counter, GPU seconds charged;
* ``tessera_workload_gpu_time_share{workload,gpu,window="1s"|"10s"}``: share of the GPU's time
  charged over the last 1 s and 10 s;
* ``tessera_workload_gpu_compute_request`` / ``_limit{workload,gpu}``: what it asked for;
* ``tessera_workload_gpu_compute_enforced{workload,gpu}``: 0 when not enforced (multi-GPU).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tessera.isolation import arbiter


def read(directory: Path) -> dict[tuple[str, str], arbiter.Usage]:
    """(GPU uuid, workload key) -> usage, from every ``*.share`` file in directory."""
    out: dict[tuple[str, str], arbiter.Usage] = {}
    if not directory.is_dir():
        return out
    for path in sorted(directory.glob("*.share")):
        try:
            for u in arbiter.usage(path):
                out[(path.stem, u.key)] = u
        except arbiter.ArbiterError:
            continue
    return out


class ComputeCollector(Collector):
    def __init__(self, directory: Path, workload_name: Callable[[str], str] | None = None) -> None:
        self.directory = directory
        self.name = workload_name or (lambda key: key)

    def gpu_seconds(self) -> dict[tuple[str, str], float]:
        """(GPU, workload id) -> GPU seconds charged: what GPU-hours used meters
        (tessera.api.tenancy.metering)."""
        return {k: u.total_seconds for k, u in read(self.directory).items()}

    def collect(self) -> Iterator[Metric]:
        labels = ["workload", "gpu"]
        total = CounterMetricFamily("tessera_workload_gpu_time_seconds",
                                    "GPU time the compute arbiter charged the workload on this GPU", labels=labels)
        share = GaugeMetricFamily("tessera_workload_gpu_time_share",
                                  "share of the GPU's time charged to the workload over the window",
                                  labels=[*labels, "window"])
        req = GaugeMetricFamily("tessera_workload_gpu_compute_request", "guaranteed share of GPU time",
                                labels=labels)
        lim = GaugeMetricFamily("tessera_workload_gpu_compute_limit", "ceiling on the share of GPU time",
                                labels=labels)
        enf = GaugeMetricFamily("tessera_workload_gpu_compute_enforced",
                                "1 when the compute share is enforced, 0 when not (multi-GPU)", labels=labels)
        for (gpu, key), u in read(self.directory).items():
            lv = [self.name(key), gpu]
            total.add_metric(lv, u.total_seconds)
            share.add_metric([*lv, "1s"], u.share_1s)
            share.add_metric([*lv, "10s"], u.share_10s)
            req.add_metric(lv, u.request)
            lim.add_metric(lv, u.limit)
            enf.add_metric(lv, 0.0 if u.multi_gpu else 1.0)
        yield from (total, share, req, lim, enf)

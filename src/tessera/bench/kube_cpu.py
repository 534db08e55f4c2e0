"""Where the CPU of the whole benchmark system goes: process CPU seconds (user + system, from
``/proc/PID/stat``) of each process of the test cluster (etcd, kube-apiserver, kwok), the
scheduler, the kubelet double and the benchmark's own client, read before and after a phase.

On the 2-core machine these all share, a phase's pods per second is bounded by the sum: a figure
per process says which one to make cheaper (docs/benchmarks.md, "bench.kube: CPU by process").
"""

from __future__ import annotations

from tessera.node import procfs


class CpuMeter:
    """``mark()`` -> a reading; ``since(reading)`` -> CPU seconds per process name since then,
    plus ``total``."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = dict(pids)

    def mark(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, pid in self.pids.items():
            cpu = procfs.cpu_seconds(pid)
            if cpu is not None:
                out[name] = cpu
        return out

    def since(self, before: dict[str, float]) -> dict[str, float]:
        now = self.mark()
        # A process started since ``before`` (the scheduler of a backlog run) counts from 0.
        out = {name: round(now[name] - before.get(name, 0.0), 1) for name in now}
        out["total"] = round(sum(out.values()), 1)
        return out

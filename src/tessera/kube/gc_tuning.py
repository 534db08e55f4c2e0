"""The scheduler process's garbage-collector thresholds.

CPython's defaults (700, 10, 10) start a young collection every 700 net allocations and a full
one, walking every tracked object, every 100 of those (when the long-lived set grew by a
quarter). The scheduler holds one parsed object per pod and node (hundreds of thousands of
tracked objects at 2,000 nodes and 16,000 pods) and each cycle allocates a workload state per
pod, so at that size collections took most of a cycle: a snapshot build plus cycle of 16,000
pods took 17.1 s of CPU with the defaults and 5.4 s with these thresholds (same machine, same
minute; docs/benchmarks.md, "bench.kube at 2,000 nodes"). Collection still runs (reference
cycles are freed), only less often; reference counting frees everything else at once.
"""

from __future__ import annotations

import gc

THRESHOLDS = (50_000, 20, 100)
"""(young, middle, old): allocations before a young collection, young collections before a
middle one, middle ones before a full one."""


def tune() -> tuple[int, int, int]:
    """Sets the scheduler's thresholds; returns the previous ones."""
    before = gc.get_threshold()
    gc.set_threshold(*THRESHOLDS)
    return before

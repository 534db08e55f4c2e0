"""What each project holds at the start of a cycle, summed exactly.

Per (project, preemptible), the exact sum of the snapshot quota (GPUs, CPU millicores, memory
bytes) of the workloads in the session, as integers of 2**-1074 (every finite float is an
integer multiple of it). ``enter`` and ``leave`` change it as a workload enters or leaves the
session (``Session.add_workload``/``remove_workload``); ``round_into`` adds the leaf sums up
the project tree and rounds each row once (Python's int / int is correctly rounded). Exact
integers add in any order to the same sum, so a session kept between cycles starts each
cycle with the same bits as a new one, whatever came and went, at a cost of the number of
projects rather than of pods (docs/scheduling.md, "What a kept session no longer walks").
"""

from __future__ import annotations

from collections.abc import Iterable

from tessera.core.projects import ProjectTree

from .workload_state import WorkloadState

_EXACT_BITS = 1074
_ONE = 1 << _EXACT_BITS


def exact(x: float) -> int:
    """``x`` as an exact integer count of 2**-1074."""
    n, d = x.as_integer_ratio()
    return n << (_EXACT_BITS + 1 - d.bit_length())


class ExactSums:
    def __init__(self, tree: ProjectTree) -> None:
        self._tree = tree
        self._held: dict[tuple[str, bool], list[int]] = {}
        self._exact: dict[tuple[float, float, float], tuple[int, int, int]] = {}
        """``exact`` of each pod vector seen (pods of one shape on one kind of device share
        one): a lookup instead of three conversions per pod."""

    def enter(self, ws: WorkloadState) -> None:
        """A workload entered with its pods placed as the snapshot has them (``pod_vectors``
        set): add them to its project's sums."""
        self.enter_all((ws,))

    def enter_all(self, states: Iterable[WorkloadState]) -> None:
        """``enter`` for each of ``states`` in order (a session's build enters 50,000 at once:
        one call, not one per workload); a workload with no pod placed holds (0, 0, 0) and
        adds nothing."""
        known = self._exact
        held = self._held
        for ws in states:
            if not ws.was_running:
                ws.held = (0, 0, 0)
                continue
            g = c = m = 0
            for v in ws.pod_vectors:
                if v is not None:
                    e = known.get(v)
                    if e is None:
                        if len(known) >= 65_536:
                            known.clear()
                        e = known[v] = (exact(v[0]), exact(v[1]), exact(v[2]))
                    g += e[0]
                    c += e[1]
                    m += e[2]
            ws.held = (g, c, m)
            if g or c or m:
                key = (ws.project, ws.preemptible)
                row = held.get(key)
                if row is None:
                    row = held[key] = [0, 0, 0]
                row[0] += g
                row[1] += c
                row[2] += m

    def leave(self, ws: WorkloadState) -> None:
        """A workload left: take back what ``enter`` added."""
        g, c, m = ws.held
        if g or c or m:
            row = self._held[(ws.project, ws.preemptible)]
            row[0] -= g
            row[1] -= c
            row[2] -= m

    def round_into(self, alloc: dict[str, list[float]], alloc_np: dict[str, list[float]]) -> None:
        """Set every row of ``alloc`` (all workloads) and ``alloc_np`` (non-preemptible ones)
        to the exact sum of its project and its descendants, rounded once."""
        sums: dict[str, list[int]] = {}
        sums_np: dict[str, list[int]] = {}
        chain = self._tree.chain
        for (project, preemptible), (g, c, m) in self._held.items():
            for table in (sums,) if preemptible else (sums, sums_np):
                for name in chain(project):
                    row = table.setdefault(name, [0, 0, 0])
                    row[0] += g
                    row[1] += c
                    row[2] += m
        _round(alloc, sums)
        _round(alloc_np, sums_np)


def _round(table: dict[str, list[float]], sums: dict[str, list[int]]) -> None:
    for name, a in table.items():
        row = sums.get(name)
        if row is None:
            a[0] = a[1] = a[2] = 0.0
        else:
            a[0], a[1], a[2] = row[0] / _ONE, row[1] / _ONE, row[2] / _ONE

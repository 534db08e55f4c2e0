"""Projects in a tree: departments above, projects that hold workloads at the leaves.

Every project has, per resource, a ``deserved`` quota (guaranteed; ``-1`` means unlimited), an
optional hard ``limit`` and an ``over_quota_weight`` (its share of idle resources within its
priority tier), plus a ``priority``: a higher priority gets idle resources first and is
reclaimed from last. GPU quota is always present; CPU and host memory are governed only for
projects that give them (a project without a CPU quota is not limited on CPU).

Units: GPUs (fractions allowed), CPU millicores, bytes of host memory.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tessera.core.errors import InvalidRequest
from tessera.core.usage import check_seconds

UNLIMITED = -1.0
"""A ``deserved`` of -1 means: guaranteed everything it asks for."""


class Resource(enum.IntEnum):
    GPU = 0
    CPU = 1
    MEMORY = 2

    @property
    def label(self) -> str:
        return ("gpu", "cpu", "memory")[self]


RESOURCES = (Resource.GPU, Resource.CPU, Resource.MEMORY)


@dataclass(frozen=True, slots=True)
class Quota:
    """One resource's quota. ``limit=None`` means no hard cap."""

    deserved: float = 0.0
    limit: float | None = None
    over_quota_weight: float = 1.0

    @property
    def deserved_amount(self) -> float:
        """Deserved as a number: ``inf`` for unlimited."""
        return math.inf if self.deserved == UNLIMITED else self.deserved

    @property
    def limit_amount(self) -> float:
        return math.inf if self.limit is None else self.limit


UNGOVERNED = Quota(deserved=UNLIMITED)
"""What a project that names no quota for CPU or memory gets for it."""


@dataclass(frozen=True, slots=True)
class Project:
    """A node of the project tree, as an admin writes it.

    ``parent=None`` puts it at the top. Only leaves may hold workloads.
    """

    name: str
    gpu: Quota = Quota()
    cpu: Quota | None = None
    memory: Quota | None = None
    priority: int = 100
    parent: str | None = None
    preempt_min_runtime: float | None = None
    """Seconds a workload of this project runs before priority preemption may evict it;
    None inherits from the parent (and finally from the cycle config)."""
    reclaim_min_runtime: float | None = None
    """Seconds before reclaim may evict it; None inherits."""
    usage_window: float | None = None
    """Time-based fair share: seconds of usage history counted for this project and those below
    it; None inherits (finally the cluster's ``UsagePolicy``)."""
    usage_half_life: float | None = None
    """Time-based fair share: seconds after which a GPU-second counts half; None inherits."""

    def quota(self, resource: Resource) -> Quota:
        if resource is Resource.GPU:
            return self.gpu
        q = self.cpu if resource is Resource.CPU else self.memory
        return UNGOVERNED if q is None else q


def _check_quota(name: str, label: str, q: Quota) -> None:
    field = f"projects.{name}.{label}"
    for attr, value in (("deserved", q.deserved), ("over_quota_weight", q.over_quota_weight)):
        if not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value):
            raise InvalidRequest(f"{field}.{attr}", "must be a number", value)
    if q.deserved != UNLIMITED and (q.deserved < 0 or math.isinf(q.deserved)):
        raise InvalidRequest(f"{field}.deserved", "must be 0 or more, or -1 for unlimited", q.deserved)
    if q.over_quota_weight < 0 or math.isinf(q.over_quota_weight):
        raise InvalidRequest(f"{field}.over_quota_weight", "must be 0 or more", q.over_quota_weight)
    if q.limit is not None:
        if isinstance(q.limit, bool) or not isinstance(q.limit, int | float) or math.isnan(q.limit):
            raise InvalidRequest(f"{field}.limit", "must be a number, or absent for no limit", q.limit)
        if q.limit < 0:
            raise InvalidRequest(f"{field}.limit", "must be 0 or more (leave it out for no limit)", q.limit)
        if q.deserved == UNLIMITED:
            raise InvalidRequest(
                f"{field}.limit", "must be absent when deserved is -1 (unlimited)", q.limit
            )
        if q.limit < q.deserved:
            raise InvalidRequest(
                f"{field}.limit", f"must be at least the deserved quota {q.deserved:g}", q.limit
            )


class ProjectTree:
    """A validated project tree. Built all at once: a bad project refuses the whole tree."""

    def __init__(self, projects: Iterable[Project]) -> None:
        ordered = list(projects)
        by_name: dict[str, Project] = {}
        for p in ordered:
            if not isinstance(p.name, str) or not p.name:
                raise InvalidRequest("projects.name", "must be a non-empty string", p.name)
            if p.name in by_name:
                raise InvalidRequest(f"projects.{p.name}", "is defined twice; names must be unique")
            by_name[p.name] = p
        for p in ordered:
            _check_quota(p.name, "gpu", p.gpu)
            if p.cpu is not None:
                _check_quota(p.name, "cpu", p.cpu)
            if p.memory is not None:
                _check_quota(p.name, "memory", p.memory)
            if isinstance(p.priority, bool) or not isinstance(p.priority, int):
                raise InvalidRequest(f"projects.{p.name}.priority", "must be a whole number", p.priority)
            for attr in ("preempt_min_runtime", "reclaim_min_runtime"):
                value = getattr(p, attr)
                if value is not None and (not isinstance(value, int | float) or value < 0):
                    raise InvalidRequest(f"projects.{p.name}.{attr}", "must be 0 or more seconds", value)
            for attr in ("usage_window", "usage_half_life"):
                value = getattr(p, attr)
                if value is not None:
                    check_seconds(f"projects.{p.name}.{attr}", value)
            if p.parent is not None and p.parent not in by_name:
                raise InvalidRequest(
                    f"projects.{p.name}.parent", "names a project that does not exist", p.parent
                )
        for p in ordered:
            seen = [p.name]
            parent = p.parent
            while parent is not None:
                if parent in seen:
                    loop = " -> ".join([*seen[seen.index(parent) :], parent])
                    raise InvalidRequest(f"projects.{p.name}.parent", f"makes a cycle in the tree ({loop})")
                seen.append(parent)
                parent = by_name[parent].parent
        self.projects: Mapping[str, Project] = by_name
        self._min_runtimes: dict[tuple[str, str, float], float] = {}
        """Asked for every victim candidate of every cycle: answered once per project."""
        self.order: tuple[str, ...] = tuple(sorted(by_name))
        children: dict[str | None, list[str]] = {}
        for name in self.order:
            children.setdefault(by_name[name].parent, []).append(name)
        self.children: Mapping[str | None, tuple[str, ...]] = {
            k: tuple(v) for k, v in children.items()
        }
        self.governed: tuple[Resource, ...] = tuple(
            r
            for r in RESOURCES
            if r is Resource.GPU or any(p.quota(r) is not UNGOVERNED for p in ordered)
        )
        """Resources fair share divides: GPU always, CPU/memory if any project gives a quota."""
        self._chains: dict[str, tuple[str, ...]] = {}
        for name in self.order:
            chain = [name]
            while by_name[chain[-1]].parent is not None:
                chain.append(by_name[chain[-1]].parent)  # type: ignore[arg-type]
            self._chains[name] = tuple(chain)

    def __contains__(self, name: object) -> bool:
        return name in self.projects

    def __getitem__(self, name: str) -> Project:
        return self.projects[name]

    def is_leaf(self, name: str) -> bool:
        return name not in self.children

    def chain(self, name: str) -> tuple[str, ...]:
        """The project and its ancestors, leaf first."""
        return self._chains[name]

    def depth_first(self) -> list[str]:
        """Parents before children, siblings by name."""
        out: list[str] = []
        stack = list(reversed(self.children.get(None, ())))
        while stack:
            name = stack.pop()
            out.append(name)
            stack.extend(reversed(self.children.get(name, ())))
        return out

    def lowest_common_ancestor(self, a: str, b: str) -> str | None:
        ancestors = set(self.chain(a))
        for name in self.chain(b):
            if name in ancestors:
                return name
        return None

    def usage_settings(self, name: str, window: float, half_life: float) -> tuple[float, float]:
        """(window, half-life) for ``name``: its own or the nearest ancestor's, else the defaults."""
        found_w = found_h = None
        for p in self.chain(name):
            project = self.projects[p]
            if found_w is None:
                found_w = project.usage_window
            if found_h is None:
                found_h = project.usage_half_life
        return (window if found_w is None else float(found_w),
                half_life if found_h is None else float(found_h))

    def min_runtime(self, name: str, kind: str, default: float) -> float:
        """``kind`` is ``preempt`` or ``reclaim``; inherited from the nearest ancestor that sets it."""
        key = (name, kind, default)
        found = self._min_runtimes.get(key)
        if found is None:
            found = default
            for p in self.chain(name):
                value: float | None = getattr(self.projects[p], f"{kind}_min_runtime")
                if value is not None:
                    found = float(value)
                    break
            self._min_runtimes[key] = found
        return found

"""The scheduling cycle: one snapshot in, one plan out.

Adapters (embedded mode, Kubernetes) call ``run_cycle(snapshot, config) -> Plan``::

    from tessera.core.cycle import CycleConfig, Snapshot, run_cycle
    plan = run_cycle(Snapshot(nodes, projects, workloads, now), CycleConfig())

or keep a ``WarmCycle(config)`` and call its ``run(snapshot)`` every cycle: the same plans, with
the session kept between cycles and only the snapshot's changes applied (``cycle.warm``).

then apply ``plan.evictions`` and ``plan.moves`` before starting ``plan.bindings`` (a binding's
``after_evictions`` names the evictions it waits for), and show ``plan.waiting`` to users.
Actions run in ``config.actions`` order; see docs/scheduling.md. To refuse bad input at
submission rather than at the next cycle: ``ProjectTree(projects)`` validates a project tree and
``validate_workload(workload, tree)`` one workload, with the same errors ``run_cycle`` raises.
"""

from tessera.core.cycle.run import run_cycle
from tessera.core.cycle.types import (
    DEFAULT_ACTIONS,
    Binding,
    CycleConfig,
    Eviction,
    Move,
    Plan,
    PodBinding,
    ProjectStatus,
    Snapshot,
    Waiting,
)
from tessera.core.cycle.validation import validate_workload
from tessera.core.cycle.warm import WarmCycle
from tessera.core.projects import Project, ProjectTree, Quota
from tessera.core.workloads import PRIORITY_CLASSES, Workload

__all__ = [
    "DEFAULT_ACTIONS",
    "PRIORITY_CLASSES",
    "Binding",
    "CycleConfig",
    "Eviction",
    "Move",
    "Plan",
    "PodBinding",
    "Project",
    "ProjectStatus",
    "ProjectTree",
    "Quota",
    "Snapshot",
    "Waiting",
    "WarmCycle",
    "Workload",
    "run_cycle",
    "validate_workload",
]

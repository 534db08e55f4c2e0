"""Dynamic MIG on Kubernetes, tessera-node's side (issue 20; docs/mig.md).

The scheduler writes on a MIG pod, when it binds it, the partition it chose
(``tessera.io/mig-partition``: ``{"gpu": UUID, "profile": "3g.20gb", "start": 4, "remove":
[0]}``). Each sync, for every pod on this node with that annotation that has not finished:

- a partition the journal records for the pod (owner: the pod's UID) is its partition;
- else an idle partition tessera made, of that profile at that slot, is given to it;
- else the idle partitions tessera made at the slots in ``remove``, and those overlapping the
  chosen slot, are removed, and the partition is made there (:class:`tessera.node.mig.MigNode`:
  journaled, so a restart neither leaks nor makes one twice).

Its ``MIG-…`` UUID is written into the pod's ConfigMap (``NVIDIA_VISIBLE_DEVICES``, read by the
container through ``configMapKeyRef``: the container cannot start before it is there). A
partition whose pod finished or is gone becomes idle, kept for reuse until the scheduler names
it in a ``remove``. Partitions tessera did not make, and busy ones, are never removed. An NVML
error or a slot that is not free comes back as the reason (a Warning Event on the pod).

The partitions are published in the node's inventory (``partitions`` of each MIG GPU), which is
what the scheduler chooses from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.core.mig import PROFILES
from tessera.node.mig import MigError, MigGpuState, MigNode, MigPartition
from tessera.node.nvml import Nvml

MIG_PARTITION = "tessera.io/mig-partition"


@dataclass(frozen=True)
class Want:
    """What the scheduler asked for a pod."""

    namespace: str
    name: str
    uid: str
    gpu: str
    profile: str
    start: int
    remove: tuple[int, ...]


@dataclass(frozen=True)
class Outcome:
    want: Want
    uuid: str | None
    error: str | None = None


def want_of(namespace: str, name: str, uid: str, annotations: dict[str, str]) -> Want | None:
    """Raises MigError on an annotation that cannot be read."""
    text = annotations.get(MIG_PARTITION)
    if not text:
        return None
    try:
        d = json.loads(text)
        return Want(namespace, name, uid, str(d["gpu"]), str(d["profile"]), int(d["start"]),
                    tuple(int(x) for x in d.get("remove") or ()))
    except (ValueError, KeyError, TypeError) as exc:
        raise MigError(f"annotation {MIG_PARTITION} is not readable: {exc}") from None


def partitions_doc(states: list[MigGpuState]) -> dict[str, list[dict[str, Any]]]:
    """GPU UUID -> its partitions, for the inventory annotation (GPUs in MIG mode only)."""
    return {s.uuid: [{"profile": p.profile, "start": p.start, "uuid": p.uuid,
                      "managed": p.managed} for p in s.partitions]
            for s in states if s.mig_enabled}


class KubeMig:
    """This node's MIG partitions for the pods the scheduler bound here (use from one thread)."""

    def __init__(self, nvml: Nvml, journal: Path) -> None:
        self.node = MigNode(nvml, journal)
        self.repairs = self.node.reconcile()

    def state(self) -> list[MigGpuState]:
        return self.node.state()

    def sync(self, wants: list[Want], wait: frozenset[str] = frozenset()) -> list[Outcome]:
        """Gives every pod its partition and frees those of pods that are gone (see the
        module's docstring); one outcome per pod, except pods in ``wait`` (UIDs whose last
        attempt failed, backing off) that have no partition yet: not tried now."""
        by_uid = {w.uid: w for w in wants}
        for rec in list(self.node.journal.partitions):
            if rec.get("owner") and rec["owner"] not in by_uid:
                self.node.assign(rec["gpu"], rec["gi"], None)
        owned = {rec["owner"]: rec for rec in self.node.journal.partitions if rec.get("owner")}
        out = []
        for w in wants:
            mine = owned.get(w.uid)
            if mine is not None:
                out.append(Outcome(w, mine.get("uuid")))
                continue
            if w.uid in wait:
                continue
            try:
                out.append(Outcome(w, self._give(w).uuid))
            except MigError as exc:
                out.append(Outcome(w, None, str(exc)))
        return out

    def _give(self, w: Want) -> MigPartition:
        state = self.node.gpu_state(w.gpu)
        prof = PROFILES.get(state.model, {}).get(w.profile)
        if not state.mig_enabled or prof is None:
            raise MigError(f"GPU {state.index} ({w.gpu}) is not in MIG mode or has no profile "
                           f"{w.profile}")
        for p in state.partitions:
            if (p.start, p.profile) == (w.start, w.profile) and p.managed and p.owner is None \
                    and p.processes == 0 and p.uuid:
                self.node.assign(w.gpu, p.gi, w.uid)
                return p
        end = w.start + prof.slots
        for p in state.partitions:
            idle = p.managed and p.owner is None and p.processes == 0
            if idle and (p.start in w.remove or (p.start < end and w.start < p.start + p.size)):
                self.node.destroy(w.gpu, p.gi)
        return self.node.create(w.gpu, w.profile, w.start, owner=w.uid)

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

Claims of the DRA class ``mig.tessera.io`` (docs/mig.md) use the same partitions through the
kubelet plugin: :meth:`KubeMig.prepare_claim` gives a claim (journal owner ``claim:UID``) the
idle partition tessera made at the allocated profile and placement, or removes the idle ones
tessera made overlapping it and makes it there; :meth:`KubeMig.release_claim` leaves it idle.
The pods' sync never releases a claim's partition. The kubelet plugin's threads and the agent's
sync share one lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera import wire
from tessera.core.mig import COMPUTE, PROFILES
from tessera.node.mig import MigError, MigGpuState, MigNode, MigPartition
from tessera.node.nvml import Nvml

MIG_PARTITION = wire.MIG_PARTITION
CLAIM_OWNER = "claim:"
"""Journal owners of partitions prepared for DRA claims: ``claim:UID``."""


def claim_of(owner: str | None) -> str | None:
    """The claim UID of a journal owner, None for a pod's (or no) owner."""
    return owner[len(CLAIM_OWNER):] if owner and owner.startswith(CLAIM_OWNER) else None


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
        hold = wire.hold_from_json(text)
        return Want(namespace, name, uid, hold.gpu, hold.profile, hold.start, hold.remove)
    except (ValueError, KeyError, TypeError) as exc:
        raise MigError(f"annotation {MIG_PARTITION} is not readable: {exc}") from None


def partitions_doc(states: list[MigGpuState]) -> dict[str, list[dict[str, Any]]]:
    """GPU UUID -> its partitions, for the inventory annotation (GPUs in MIG mode only)."""
    return {s.uuid: [{"profile": p.profile, "start": p.start, "uuid": p.uuid,
                      "managed": p.managed,
                      **({"claim": claim_of(p.owner)} if claim_of(p.owner) else {})}
                     for p in s.partitions]
            for s in states if s.mig_enabled}


class KubeMig:
    """This node's MIG partitions for the pods the scheduler bound here (use from one thread)."""

    def __init__(self, nvml: Nvml, journal: Path) -> None:
        self.node = MigNode(nvml, journal)
        self.repairs = self.node.reconcile()
        self.lock = threading.RLock()
        """Held by every call: the kubelet plugin prepares claims from its own threads."""

    def state(self) -> list[MigGpuState]:
        with self.lock:
            return self.node.state()

    def sync(self, wants: list[Want], wait: frozenset[str] = frozenset()) -> list[Outcome]:
        """Gives every pod its partition and frees those of pods that are gone (see the
        module's docstring); one outcome per pod, except pods in ``wait`` (UIDs whose last
        attempt failed, backing off) that have no partition yet: not tried now. Partitions of
        DRA claims are left to the kubelet plugin."""
        with self.lock:
            return self._sync(wants, wait)

    def _sync(self, wants: list[Want], wait: frozenset[str]) -> list[Outcome]:
        by_uid = {w.uid: w for w in wants}
        for rec in list(self.node.journal.partitions):
            if rec.get("owner") and rec["owner"] not in by_uid and not claim_of(rec["owner"]):
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

    # ---- DRA claims (the kubelet plugin, tessera.node.draplugin) --------------------------------

    def prepare_claim(self, claim_uid: str, gpu: str, profile: str, start: int) -> MigPartition:
        """The partition of a claim's MIG device: the one already prepared for it, else an idle
        one tessera made there (reuse), else made there after removing the idle partitions
        tessera made that overlap it. MigError naming the step (nothing half-made: see
        :meth:`MigNode.create`) or what holds the slots."""
        owner = CLAIM_OWNER + claim_uid
        with self.lock:
            state = self.node.gpu_state(gpu)
            for p in state.partitions:
                if p.owner == owner and (p.profile, p.start) == (profile, start):
                    return p
            prof = PROFILES.get(state.model, {}).get(profile)
            if not state.mig_enabled or prof is None:
                raise MigError(f"GPU {state.index} ({gpu}) is not in MIG mode or has no profile "
                               f"{profile}")
            end = start + prof.slots
            for p in state.partitions:
                mine = (p.profile, p.start) == (profile, start) and p.managed and p.owner is None
                if mine or not (p.start < end and start < p.start + p.size):
                    continue
                if not p.managed:
                    who = "a partition tessera did not make"
                elif p.owner is not None:
                    who = (f"claim {claim_of(p.owner)}" if claim_of(p.owner)
                           else f"pod {p.owner}")
                elif p.processes:
                    who = f"{p.processes} process(es) on an idle partition"
                else:
                    continue  # idle and tessera's: removed for this one
                raise MigError(f"memory slots {start}-{end - 1} of GPU {state.index} ({gpu}) "
                               f"overlap the {p.profile} partition at slot {p.start}, held by "
                               f"{who}")
            # Idle ones elsewhere on the GPU go too when the compute they use is needed (the
            # largest first, as tessera.core.mig.choose removes them).
            table = PROFILES[state.model]
            kept = [p for p in state.partitions if not (p.start < end and start < p.start + p.size)
                    and p.profile in table]
            remove: list[int] = []
            idle = sorted((p for p in kept if p.managed and p.owner is None and not p.processes),
                          key=lambda p: table[p.profile].compute)
            while idle and sum(table[p.profile].compute for p in kept) + prof.compute > COMPUTE:
                gone = idle.pop()
                kept.remove(gone)
                remove.append(gone.start)
            return self._give(Want("", "", owner, gpu, profile, start, tuple(remove)))

    def release_claim(self, claim_uid: str) -> int:
        """Leaves the claim's partitions idle (kept for reuse until their room is needed);
        returns how many."""
        owner = CLAIM_OWNER + claim_uid
        with self.lock:
            recs = [r for r in self.node.journal.partitions if r.get("owner") == owner]
            for rec in recs:
                self.node.assign(rec["gpu"], rec["gi"], None)
            return len(recs)

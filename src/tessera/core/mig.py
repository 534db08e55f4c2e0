"""MIG (Multi-Instance GPU) geometry and the choice of where a partition goes.

A GPU in MIG mode is cut into GPU instances of fixed *profiles* (``3g.20gb``: 3 of 7 compute
slices, 20 GB). Each profile may start only at certain memory slots (eighths of the memory), and
an instance covers ``slots`` consecutive ones; instances never overlap and together use at most
the GPU's 7 compute slices. The tables are NVIDIA's (MIG user guide, "Supported MIG Profiles";
the placements are what ``nvidia-smi mig -lgipp`` lists): the same geometry on the A100 and the
H100, with the memory in the names scaled to the product.

:func:`choose` is pure: given the partitions that exist on a node's MIG GPUs (busy or idle), it
says which idle partition to reuse, or where to create one, and which idle partitions must go
first when nothing else fits. It never touches a busy partition and never removes an idle one
while a free placement exists, so a partition another workload could use now stays (seed 003:
"the partition isn't removed until the scheduler determines that it's needed elsewhere").
Among the free placements it makes the fewest free slots unusable (a free slot is unusable when
no profile could be created on it: none starts there, or the GPU's compute is spent), keeps the
largest contiguous run of free slots (what the largest profiles need), and packs GPUs that are
already cut before cutting an intact one.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuKind, GpuRequest

SLOTS = 8
"""Memory slots of a MIG GPU (placements are in these units)."""
COMPUTE = 7
"""Compute slices of a MIG GPU."""


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str
    """``3g.20gb``."""
    compute: int
    """Compute slices (of 7)."""
    slots: int
    """Memory slots it covers (of 8)."""
    starts: tuple[int, ...]
    """The memory slots it may start at."""

    @property
    def fraction(self) -> float:
        """What quota and fair share count it as: its share of the GPU's compute."""
        return round(self.compute / COMPUTE, 3)


def _table(gb: tuple[int, int, int, int, int]) -> dict[str, MigProfile]:
    one, one_double, two, three_four, seven = gb
    rows = [
        (f"1g.{one}gb", 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        (f"1g.{one_double}gb", 1, 2, (0, 2, 4, 6)),
        (f"2g.{two}gb", 2, 2, (0, 2, 4)),
        (f"3g.{three_four}gb", 3, 4, (0, 4)),
        (f"4g.{three_four}gb", 4, 4, (0,)),
        (f"7g.{seven}gb", 7, 8, (0,)),
    ]
    return {name: MigProfile(name, compute, slots, starts) for name, compute, slots, starts in rows}


PROFILES: dict[str, dict[str, MigProfile]] = {
    "A100-40GB": _table((5, 10, 10, 20, 40)),
    "A100-80GB": _table((10, 20, 20, 40, 80)),
    "H100-80GB": _table((10, 20, 20, 40, 80)),
    "H100-94GB": _table((12, 24, 24, 47, 94)),
    "H200-141GB": _table((18, 35, 35, 71, 141)),
}
"""MIG-capable models tessera knows, by the short model name of :mod:`tessera.core.gpu_models`."""

MEMORY_MIB: dict[str, dict[str, int]] = {
    model: dict(zip(PROFILES[model], mib, strict=True)) for model, mib in {
        "A100-40GB": (4864, 9856, 9856, 19968, 19968, 40192),
        "A100-80GB": (9728, 19968, 19968, 40192, 40192, 80896),
        "H100-80GB": (9984, 20096, 20096, 40448, 40448, 81152),
        "H100-94GB": (11776, 23808, 23808, 47872, 47872, 95744),
        "H200-141GB": (16384, 32768, 32768, 65536, 65536, 143360),
    }.items()}
"""A profile's memory as NVML reports it (``nvidia-smi mig -lgip``, MiB): a little less than its
name says, since MIG keeps some for itself (``1g.5gb`` has 4864 MiB on an A100-40GB)."""


def smallest_fitting(model: str, *, memory: int | None = None,
                     portion: Decimal | None = None) -> MigProfile | None:
    """The profile of ``model`` that serves a share (exactly one of ``memory``, in bytes, or
    ``portion``, of a GPU): the least memory that holds it, ties broken by fewer compute slices
    (``1g.10gb`` before ``2g.10gb``); None when no profile holds it. A portion is of the GPU's
    memory as MIG cuts it, its eight memory slots: 0.25 needs two (``1g.10gb`` on an A100-40GB,
    ``1g.20gb`` on an A100-80GB). Bytes are held against the memory NVML reports for the
    profile (:data:`MEMORY_MIB`): 5G (4768 MiB) fits ``1g.5gb`` (4864 MiB), 5Gi does not."""
    if (memory is None) == (portion is None):
        raise ValueError("give memory or portion")
    table = PROFILES.get(model)
    if table is None:
        return None
    mib = MEMORY_MIB[model]
    fits = [p for p in table.values()
            if (portion is not None and portion > 0 and portion * SLOTS <= p.slots)
            or (memory is not None and 0 < memory <= mib[p.name] * 2**20)]
    return min(fits, key=lambda p: (mib[p.name], p.compute), default=None)


SERVES_SHARES = "tessera.io/mig-serves-shares"
"""The node label by which an operator lets a node's MIG GPUs serve shares (docs/mig.md)."""


def parse_serves_shares(value: object, field: str) -> bool:
    """The operator's switch for shares served by MIG (a node label, an environment variable):
    ``true`` or ``false`` (also ``1``/``0``, ``yes``/``no``, any case); anything else is refused
    naming where it was written."""
    text = value.strip().lower() if isinstance(value, str) else None
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise InvalidRequest(field, "must be true or false (whether this node's GPUs in MIG mode may "
                                "serve shares by the smallest fitting profile)", value)


SERVABLE_WAITS = ("placement", "unschedulable", "fair-share")
"""The cycle's waits a MIG partition serving a share may end (docs/mig.md, both modes): no room
on the shared GPUs (over its fair share too: a free partition is idle room). A limit or quota
wait is not one: a partition would count against the same limit."""


def serving_profile(request: GpuRequest, model: str) -> MigProfile | None:
    """The profile that would serve this share on a MIG GPU of ``model``, or None when it is not
    one a partition can serve: only a share of one device (a portion or an amount of memory, not
    whole GPUs, not several devices), of a model it allows. It is sized by the guaranteed
    request; a burst limit above it is capped by the partition (docs/mig.md)."""
    if request.kind not in (GpuKind.PORTION, GpuKind.MEMORY) or request.devices != 1 \
            or not request.allows(model):
        return None
    if request.kind is GpuKind.PORTION:
        return smallest_fitting(model, portion=request.portion)
    return smallest_fitting(model, memory=request.memory)


_NAME = re.compile(r"(?:nvidia\.com/)?(?:mig[- ])?(\d)g\.(\d{1,3})gb", re.IGNORECASE)


def parse_profile(text: object, field: str = "gpuMigProfile") -> str:
    """The canonical profile name from any spelling users write: ``3g.20gb``, ``mig-3g.20gb``,
    ``MIG 3g.20gb`` or the GPU operator's resource ``nvidia.com/mig-3g.20gb``."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest(field, "must be a MIG profile such as 3g.20gb", text)
    m = _NAME.fullmatch(text.strip())
    if m is None:
        raise InvalidRequest(field, "must be a MIG profile such as 1g.10gb or 3g.40gb "
                                    "(COMPUTEg.MEMORYgb)", text)
    name = f"{m.group(1)}g.{int(m.group(2))}gb"
    if not any(name in table for table in PROFILES.values()):
        known = sorted({n for table in PROFILES.values() for n in table}, key=_order)
        raise InvalidRequest(field, f"is not a MIG profile of any GPU tessera knows "
                                    f"({', '.join(known)})", text)
    return name


def _order(name: str) -> tuple[int, int]:
    compute, memory = name.split("g.", 1)
    return int(compute), int(memory.removesuffix("gb"))


def profile_of(model: str, name: str) -> MigProfile | None:
    return PROFILES.get(model, {}).get(name)


def profile_slots(model: str, name: str) -> int:
    """Memory slots (of 8) a partition of ``name`` covers on ``model`` (``+me`` as its base
    profile); 1 for a profile the table does not have (drawn as one slot)."""
    profile = profile_of(model, name.removesuffix("+me"))
    return profile.slots if profile is not None else 1


def profile_fraction(name: str) -> float:
    """The GPU fraction a canonical profile counts as in quota: its compute slices of 7, the
    same on every GPU that has it (``3g.20gb`` = 0.429). KeyError for a name no table has."""
    for table in PROFILES.values():
        if name in table:
            return table[name].fraction
    raise KeyError(name)


def fraction_on(models: Iterable[str], name: str) -> float | None:
    """The GPU fraction a profile counts as where one of ``models`` has it; None where none
    does (the caller refuses it, naming what exists: :func:`supported_text`)."""
    fits = [p for m in models if (p := profile_of(m, name)) is not None]
    return min((p.fraction for p in fits), default=None)


def supported_text(models: Iterable[str]) -> str:
    """What the given models offer, for a reason a person can act on."""
    parts = [f"{m}: {', '.join(sorted(PROFILES[m], key=_order))}" for m in sorted(set(models))
             if m in PROFILES]
    return "; ".join(parts) if parts else "no MIG-capable GPU"


@dataclass(frozen=True, slots=True)
class Partition:
    """One GPU instance that exists on a GPU."""

    profile: str
    start: int
    busy: bool
    """A workload holds it."""
    uuid: str = ""
    holder: str = ""
    """The workload holding a busy partition, as the caller names it (:func:`make_room` may
    evict it); "" when not known (an operator's partition): never a victim."""


@dataclass(frozen=True, slots=True)
class MigGpu:
    """A GPU in MIG mode and the partitions on it."""

    key: str
    """Node and index, as the caller names it (``node-1/0``)."""
    model: str
    partitions: tuple[Partition, ...] = ()


@dataclass(frozen=True, slots=True)
class MigChoice:
    gpu: str
    start: int
    reuse: Partition | None = None
    """An idle partition of the profile, taken as it is."""
    destroy: tuple[Partition, ...] = ()
    """Idle partitions to remove first (only when no free placement exists anywhere)."""


def _used(partitions: Iterable[Partition], model: str) -> tuple[list[bool], int]:
    taken = [False] * SLOTS
    compute = 0
    table = PROFILES[model]
    for p in partitions:
        prof = table[p.profile]
        for s in range(p.start, p.start + prof.slots):
            taken[s] = True
        compute += prof.compute
    return taken, compute


def free_placements(model: str, partitions: Sequence[Partition], profile: MigProfile) -> list[int]:
    """Starts where ``profile`` can be created now next to ``partitions``."""
    taken, compute = _used(partitions, model)
    if compute + profile.compute > COMPUTE:
        return []
    return [s for s in profile.starts if not any(taken[s:s + profile.slots])]


def _longest_free(taken: Sequence[bool]) -> int:
    best = run = 0
    for t in taken:
        run = 0 if t else run + 1
        best = max(best, run)
    return best


def unusable_slots(model: str, partitions: Sequence[Partition]) -> int:
    """Free memory slots that no profile could be created on, given what exists: the
    fragmentation figure of the MIG benchmark."""
    taken, _ = _used(partitions, model)
    coverable = [False] * SLOTS
    for prof in PROFILES[model].values():
        for start in free_placements(model, partitions, prof):
            for s in range(start, start + prof.slots):
                coverable[s] = True
    return sum(1 for s in range(SLOTS) if not taken[s] and not coverable[s])


def _score(model: str, partitions: Sequence[Partition], profile: MigProfile,
           start: int) -> tuple[int, int, int, int]:
    after = (*partitions, Partition(profile.name, start, True))
    taken_before, _ = _used(partitions, model)
    taken_after, compute_after = _used(after, model)
    # Larger is better: the fewest free slots made unusable for every profile (the benchmark's
    # fragmentation figure), then the least loss of the GPU's longest free run (what the
    # largest profiles need), then the fullest GPU by compute (pack), then the lower slot.
    return (unusable_slots(model, partitions) - unusable_slots(model, after),
            _longest_free(taken_after) - _longest_free(taken_before),
            compute_after, -start)


def choose(gpus: Sequence[MigGpu], name: str) -> MigChoice | None:
    """Where a partition of profile ``name`` goes on these GPUs; None when nothing, not even
    removing idle partitions, makes room. Idle partitions of the profile are reused first (on
    the GPU with the most busy slots), then the free placement that makes the fewest free
    slots unusable, costs its GPU the least of its longest free run, and packs cut GPUs first."""
    for gpu in sorted(gpus, key=lambda g: -sum(PROFILES[g.model][p.profile].slots
                                                for p in g.partitions if p.busy)):
        for p in gpu.partitions:
            if p.profile == name and not p.busy:
                return MigChoice(gpu.key, p.start, reuse=p)
    best: tuple[tuple[int, int, int, int], MigChoice] | None = None
    for gpu in gpus:
        found = _best_start(gpu.model, tuple(sorted((p.profile, p.start) for p in gpu.partitions)),
                            name)
        if found is not None and (best is None or found[0] > best[0]):
            best = (found[0], MigChoice(gpu.key, found[1]))
    if best is not None:
        return best[1]
    return _by_removing_idle(gpus, name)


@functools.lru_cache(maxsize=65536)
def _best_start(model: str, layout: tuple[tuple[str, int], ...],
                name: str) -> tuple[tuple[int, int, int, int], int] | None:
    """The best free start for ``name`` on a GPU with this layout, and its score. GPUs of a
    fleet share few layouts (most are empty or cut alike), so this is asked once per layout."""
    profile = profile_of(model, name)
    if profile is None:
        return None
    partitions = tuple(Partition(prof, start, True) for prof, start in layout)
    best: tuple[tuple[int, int, int, int], int] | None = None
    for start in free_placements(model, partitions, profile):
        score = _score(model, partitions, profile, start)
        if best is None or score > best[0]:
            best = (score, start)
    return best


def _by_removing_idle(gpus: Sequence[MigGpu], name: str) -> MigChoice | None:
    """The placement that removes the fewest idle partitions (then the fewest slots of them)."""
    best: tuple[tuple[int, int], MigChoice] | None = None
    for gpu in gpus:
        profile = profile_of(gpu.model, name)
        if profile is None:
            continue
        busy = [p for p in gpu.partitions if p.busy]
        idle = [p for p in gpu.partitions if not p.busy]
        for start in free_placements(gpu.model, busy, profile):
            end = start + profile.slots
            table = PROFILES[gpu.model]
            overlapping = [p for p in idle if p.start < end and start < p.start + table[p.profile].slots]
            keep = [p for p in idle if p not in overlapping]
            # The kept idle ones must still leave compute for the new partition.
            while keep and start not in free_placements(gpu.model, busy + keep, profile):
                keep.sort(key=lambda p: table[p.profile].compute)
                overlapping.append(keep.pop())
            if start not in free_placements(gpu.model, busy + keep, profile):
                continue
            cost = (len(overlapping), sum(table[p.profile].slots for p in overlapping))
            if best is None or cost < best[0]:
                best = (cost, MigChoice(gpu.key, start, destroy=tuple(overlapping)))
    return best[1] if best is not None else None


def choose_serving(gpus: Sequence[MigGpu], request: GpuRequest) -> tuple[str, MigChoice] | None:
    """The profile and place that serve a share on these GPUs (:func:`serving_profile` on each
    GPU's model, then :func:`choose` among the GPUs of that model); where the GPUs are of several
    models, an idle partition reused first, then a placement that removes nothing, then the
    fewest removals, then the smaller profile. None when no profile fits or has room."""
    best: tuple[tuple[int, int, int], str, MigChoice] | None = None
    for model in sorted({g.model for g in gpus}):
        profile = serving_profile(request, model)
        if profile is None:
            continue
        choice = choose([g for g in gpus if g.model == model], profile.name)
        if choice is None:
            continue
        rank = (0 if choice.reuse is not None else 1, len(choice.destroy), profile.slots)
        if best is None or rank < best[0]:
            best = (rank, profile.name, choice)
    return None if best is None else (best[1], best[2])


@dataclass(frozen=True, slots=True)
class Victim:
    """A running workload :func:`make_room` may evict, and what evicting it costs."""

    priority: int
    gpus: float
    """What it gives back (quota units: its profiles' fractions, all its pods)."""


@dataclass(frozen=True, slots=True)
class MigRoom:
    """Victims whose partitions, once idle, let :func:`choose` place the profile on ``gpu``."""

    gpu: str
    victims: tuple[str, ...]
    choice: MigChoice
    """What :func:`choose` does then, on that GPU alone."""


def released(gpu: MigGpu, holders: Iterable[str]) -> MigGpu:
    """The GPU with the partitions of ``holders`` idle (their workloads gone)."""
    gone = set(holders)
    return MigGpu(gpu.key, gpu.model, tuple(
        Partition(p.profile, p.start, False, p.uuid) if p.busy and p.holder in gone else p
        for p in gpu.partitions))


def make_room(
    gpus: Sequence[MigGpu],
    name: str,
    victims: Mapping[str, Victim],
    allow: Callable[[str, tuple[str, ...]], bool] | None = None,
) -> MigRoom | None:
    """The cheapest set of ``victims`` (workloads holding busy partitions) whose eviction lets
    :func:`choose` place profile ``name`` on one GPU; None when no allowed set does.

    Cheapest: the fewest victims, then the lowest priorities (the highest one evicted first
    compared), then the fewest GPUs given back, then the GPU and the ids. Every victim is
    needed: a set of which a smaller part already makes room is never returned (room only
    grows as partitions become idle, so one victim less is the test). ``allow(gpu, victims)``
    is the caller's rule (quota, fair share, priority, the node's CPU) for taking that set on
    that GPU. With room already (no victim needed) that is the answer, with no victims. The
    search is exhaustive per GPU: at most 7 partitions, so 127 sets."""
    now = choose(gpus, name)
    if now is not None:
        return MigRoom(now.gpu, (), now)
    options: list[tuple[tuple[int, tuple[int, ...], float, str, tuple[str, ...]], MigChoice]] = []
    for gpu in gpus:
        if profile_of(gpu.model, name) is None:
            continue
        holders = sorted({p.holder for p in gpu.partitions if p.busy and p.holder in victims})
        if not holders or choose([released(gpu, holders)], name) is None:
            continue  # even every victim on it would not make room
        roomy: set[tuple[str, ...]] = set()
        """Sets that make room; a superset of one is marked without asking (room only grows)."""
        for k in range(1, len(holders) + 1):
            for combo in itertools.combinations(holders, k):
                if any(combo[:i] + combo[i + 1:] in roomy for i in range(k)):
                    roomy.add(combo)
                    continue  # a smaller set makes room: this one has a needless victim
                choice = choose([released(gpu, combo)], name)
                if choice is None:
                    continue
                roomy.add(combo)
                cost = (k, tuple(sorted((victims[h].priority for h in combo), reverse=True)),
                        round(sum(victims[h].gpus for h in combo), 6), gpu.key, combo)
                options.append((cost, choice))
    options.sort(key=lambda o: o[0])
    for (_, _, _, key, combo), choice in options:
        if allow is None or allow(key, combo):
            return MigRoom(key, combo, choice)
    return None


_PLACEMENT_NAME = re.compile(r"gpu-(\d+)-mig-(\d)g(\d{1,3})gb-(\d)")


def placement_name(index: int, profile: str, start: int) -> str:
    """``gpu-0-mig-3g20gb-4``: a placement of a profile on GPU ``index`` as a DNS label (no
    dots), the name of its DRA device (tessera.node.resourceslice, tessera.kube.claims)."""
    return f"gpu-{index}-mig-{profile.replace('.', '')}-{start}"


def parse_placement_name(name: str) -> tuple[int, str, int] | None:
    """(GPU index, profile, start) of a :func:`placement_name`; None for any other name."""
    m = _PLACEMENT_NAME.fullmatch(name)
    if m is None:
        return None
    return int(m.group(1)), f"{m.group(2)}g.{int(m.group(3))}gb", int(m.group(4))

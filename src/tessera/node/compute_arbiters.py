"""Compute share on a Kubernetes node: tessera-node owns one arbiter per GPU (issue 30;
docs/compute-share.md).

The arbiters live in the node's shared ledger directory (``--loans-dir``, which the webhook and
the DRA plugin's CDI edits already mount read-write into every share container at
``/run/tessera-loans``), under ``compute/``:

    LOANS/compute/                  0755 root: tenants cannot create, rename or delete arbiters
    LOANS/compute/<GPU-uuid>.share  0666: every share's processes map it (tessera.isolation.arbiter)

For each share pod with a compute share (the canonical ``tessera.io/gpu-compute-request|limit``
the webhook writes), the agent writes the pod's entry (key: its ``tessera.io/gpu-config-key``;
request, limit, latency class for ``inference``) into each of its GPUs' arbiters, and the text
of ``gpu-compute.conf``, which the share-files step puts in the container's config directory
(``/etc/tessera``, where the library looks) **in the same rename that makes the directory
appear**: the kubelet does not start the container before that directory exists, so a share
container never starts without its arbiter. A share whose arbiter cannot be made gets no files
at all (fail closed, with the reason in a ``GPUIsolationFailed`` Event).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tessera.core import compute
from tessera.core.errors import InvalidRequest
from tessera.isolation import arbiter

SUBDIR = "compute"
CONF_NAME = "gpu-compute.conf"
CONTAINER_LOANS_DIR = "/run/tessera-loans"
"""Where a share container sees the node's ledger directory (the webhook's and CDI's mount)."""


class ComputeSetupError(RuntimeError):
    """A share's compute arbiter could not be set up; the message says what and where."""


@dataclass(frozen=True)
class ComputeEntry:
    """One share pod's compute share on this node."""

    key: str
    uuids: tuple[str, ...]
    request: float
    limit: float
    latency: bool = False


def entry_of(key: str, uuids: Iterable[str], annotations: Mapping[str, str],
             priority_class: str = "") -> ComputeEntry | None:
    """The compute share a pod's annotations give it on these GPUs; None when its kernels are
    not gated (no compute share, or its mode is off). Raises InvalidRequest naming the
    annotation for a value the library could not be given."""
    request = annotations.get(compute.ANNOTATION_REQUEST)
    if request is None or annotations.get(compute.ANNOTATION_MODE, "").strip() == "off":
        return None
    r = compute.parse_fraction(request, compute.ANNOTATION_REQUEST)
    lim = compute.parse_fraction(annotations.get(compute.ANNOTATION_LIMIT, "1"), compute.ANNOTATION_LIMIT)
    if lim < r:
        raise InvalidRequest(compute.ANNOTATION_LIMIT, f"must be at least {compute.ANNOTATION_REQUEST} ({r})",
                             str(lim))
    return ComputeEntry(key, tuple(uuids), float(r), float(lim), latency=priority_class == "inference")


def arbiter_dir(ledger_dir: Path) -> Path:
    return ledger_dir / SUBDIR


def arbiter_path(ledger_dir: Path, uuid: str) -> Path:
    if not uuid or "/" in uuid or uuid.startswith("."):
        raise ComputeSetupError(f"GPU UUID {uuid!r} cannot name an arbiter file")
    return arbiter_dir(ledger_dir) / f"{uuid}.share"


def conf_text(entry: ComputeEntry, container_dir: str = CONTAINER_LOANS_DIR) -> str:
    """gpu-compute.conf as the container's library reads it: its arbiters by the path the
    container sees, and its entry's key."""
    lines = ["# written by tessera-node: compute share (docs/compute-share.md)"]
    lines += [f"arbiter {container_dir}/{SUBDIR}/{u}.share" for u in entry.uuids]
    lines.append(f"workload {entry.key}")
    return "\n".join(lines) + "\n"


class ComputeArbiters:
    """The node's arbiters and the entries this agent wrote into them."""

    def __init__(self, ledger_dir: Path | None, quantum_ms: float = 20.0) -> None:
        self.ledger_dir = ledger_dir
        self.quantum_ms = quantum_ms
        self.written: dict[str, tuple[ComputeEntry, ...]] = {}
        """Share key -> the entry written for it (to rewrite only on change, remove when gone)."""

    def _ensure(self, uuid: str) -> Path:
        assert self.ledger_dir is not None
        directory = arbiter_dir(self.ledger_dir)
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o755)
        path = arbiter_path(self.ledger_dir, uuid)
        try:
            arbiter.mode_of(path)
        except arbiter.ArbiterError:
            # Missing, or corrupt (its users already refuse to launch): a fresh one.
            arbiter.create(path, mode="fair", quantum_ms=self.quantum_ms)
            for key, entries in list(self.written.items()):
                if any(uuid in e.uuids for e in entries):
                    del self.written[key]  # rewritten into the new file below
        return path

    def apply(self, entry: ComputeEntry) -> str:
        """Writes the entry into its GPUs' arbiters (made if missing); returns the text of its
        gpu-compute.conf. Raises ComputeSetupError saying why it cannot be enforced."""
        if self.ledger_dir is None:
            raise ComputeSetupError("this tessera-node runs without a ledger directory (--loans-dir), "
                                    "where compute arbiters live; not started ungated")
        try:
            paths = [self._ensure(u) for u in entry.uuids]
            if self.written.get(entry.key) != (entry,):
                for p in paths:
                    arbiter.set_share(p, arbiter.Share(entry.key, entry.request, entry.limit, entry.latency))
                self.written[entry.key] = (entry,)
        except (OSError, arbiter.ArbiterError) as exc:
            self.written.pop(entry.key, None)
            raise ComputeSetupError(f"cannot set up the compute arbiter under "
                                    f"{arbiter_dir(self.ledger_dir)}: {exc}; not started ungated") from exc
        return conf_text(entry)

    def forget_gone(self, live: Iterable[str]) -> list[str]:
        """Removes the entries of shares no longer on this node; returns their keys."""
        keep = set(live)
        gone = [k for k in self.written if k not in keep]
        for key in gone:
            entries = self.written.pop(key)
            if self.ledger_dir is None:
                continue
            for e in entries:
                for u in e.uuids:
                    with contextlib.suppress(OSError, arbiter.ArbiterError, ComputeSetupError):
                        arbiter.remove_share(arbiter_path(self.ledger_dir, u), key)
        return gone

    def usage(self) -> dict[str, list[arbiter.Usage]]:
        """GPU UUID -> the charged GPU time of each entry (metrics)."""
        out: dict[str, list[arbiter.Usage]] = {}
        if self.ledger_dir is None or not arbiter_dir(self.ledger_dir).is_dir():
            return out
        for path in sorted(arbiter_dir(self.ledger_dir).glob("*.share")):
            with contextlib.suppress(OSError, arbiter.ArbiterError):
                out[path.name[: -len(".share")]] = arbiter.usage(path)
        return out

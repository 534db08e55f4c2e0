"""Chosen crash points for the fault suite (``python -m tessera.bench.faults``) and its tests.

``TESSERA_FAULT_POINT=NAME`` (or ``NAME:N``, the N-th time it is reached) makes the server kill
itself with SIGKILL at that point, as a crash or an OOM kill would, so a test can stop it
exactly between two steps that must survive a crash together (the intent of a start and its
processes, say). Unset, each point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

_SPEC = os.environ.get("TESSERA_FAULT_POINT", "")
_NAME, _, _COUNT = _SPEC.partition(":")
_seen: dict[str, int] = {}


def hit(name: str) -> None:
    """Crash here if this is the chosen point (and occurrence)."""
    if not _NAME or name != _NAME:
        return
    _seen[name] = _seen.get(name, 0) + 1
    if _seen[name] >= int(_COUNT or 1):
        os.kill(os.getpid(), signal.SIGKILL)

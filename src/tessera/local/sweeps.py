"""Hyperparameter sweeps in embedded mode: ``tessera submit NAME --parallelism P --completions C
[--backoff-limit B]``, as a Kubernetes Indexed Job runs them.

A sweep runs trials 0..C-1, each a one-pod training named ``NAME-I`` (a retry: ``NAME-I-rN``)
whose process sees ``JOB_COMPLETION_INDEX=I`` (and ``TESSERA_SWEEP=NAME``). At most P trials
exist unfinished at any time, pending ones included, so never more than P run at once. A trial
that fails is submitted again, with the same index, until the sweep has retried B times in all
(``backoffLimit`` counts every retry of the sweep, as a Job's does); then the sweep fails and
starts no more trials. The sweep completes when every index has a trial that exited 0.

State lives in ``sweeps.json`` in the data directory (written whole, atomically), so a sweep
goes on after the server restarts. :meth:`Sweeps.tick` runs at the start of every control cycle,
under the backend's lock.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.api.backend import WorkloadSubmission
from tessera.core.errors import InvalidRequest
from tessera.core.requests import gpu_request_from_dict, gpu_request_to_dict

INDEX_ENV = "JOB_COMPLETION_INDEX"
SWEEP_ENV = "TESSERA_SWEEP"
FINISHED = ("Completed", "Failed", "Stopped")
SWEEP_FIELDS = ("parallelism", "completions", "backoffLimit")
DEFAULT_BACKOFF_LIMIT = 6
"""As a Kubernetes Job's."""


@dataclass
class Sweep:
    name: str
    project: str
    parallelism: int
    completions: int
    backoff_limit: int
    submission: dict[str, Any]
    """The trial's WorkloadSubmission fields (name and env filled per trial)."""
    done: list[int] = field(default_factory=list)
    queue: list[int] = field(default_factory=list)
    """Indexes waiting for a trial (retries first)."""
    running: dict[str, int] = field(default_factory=dict)
    """Trial workload id -> its index."""
    attempts: dict[str, int] = field(default_factory=dict)
    retries: int = 0
    phase: str = "Running"
    message: str = ""
    peak: int = 0
    """The most trials unfinished at once (at most parallelism)."""


class Sweeps:
    def __init__(self, path: Path, submit: Callable[[WorkloadSubmission], dict[str, Any]],
                 phase_of: Callable[[str], tuple[str, str] | None]) -> None:
        """``submit``: the backend's submit; ``phase_of``: a workload id's (phase, message),
        None once it is gone (deleted)."""
        self.path = path
        self._submit = submit
        self._phase_of = phase_of
        self.sweeps: dict[str, Sweep] = {}
        if path.exists():
            for raw in json.loads(path.read_text()):
                s = Sweep(**raw)
                s.running = {k: int(v) for k, v in s.running.items()}
                self.sweeps[f"{s.project}/{s.name}"] = s

    def _save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps([dataclasses.asdict(s) for s in self.sweeps.values()]))
        os.replace(tmp, self.path)

    def create(self, s: WorkloadSubmission, parallelism: int, completions: int,
               backoff_limit: int) -> dict[str, Any]:
        key = f"{s.project}/{s.name}"
        if key in self.sweeps:
            raise InvalidRequest("name", f"a sweep named {s.name} already exists in project "
                                 f"{s.project}", s.name)
        sub = {f.name: getattr(s, f.name) for f in dataclasses.fields(s)}
        sub["gpu"] = gpu_request_to_dict(s.gpu)
        sweep = Sweep(s.name, s.project, parallelism, completions, backoff_limit, sub,
                      queue=list(range(completions)))
        first = self._launch(sweep)  # the first trial validates the request (quota, GPUs)
        self.sweeps[key] = sweep
        self._fill(sweep)
        self._save()
        return {**first, "name": s.name, "sweep": self.doc(sweep)}

    def _launch(self, sweep: Sweep) -> dict[str, Any]:
        index = sweep.queue[0]
        n = sweep.attempts.get(str(index), 0)
        fields = dict(sweep.submission)
        fields["name"] = f"{sweep.name}-{index}" + (f"-r{n}" if n else "")
        fields["env"] = {**fields.get("env", {}), INDEX_ENV: str(index), SWEEP_ENV: sweep.name}
        fields["spec"] = {**{k: v for k, v in fields.get("spec", {}).items()
                             if k not in SWEEP_FIELDS}, "sweep": sweep.name, "index": index}
        fields["gpu"] = gpu_request_from_dict(fields["gpu"])
        w = self._submit(WorkloadSubmission(**fields))
        sweep.queue.pop(0)
        sweep.attempts[str(index)] = n + 1
        sweep.running[str(w["workloadId"])] = index
        sweep.peak = max(sweep.peak, len(sweep.running))
        return w

    def _fill(self, sweep: Sweep) -> None:
        while sweep.phase == "Running" and sweep.queue and len(sweep.running) < sweep.parallelism:
            try:
                self._launch(sweep)
            except InvalidRequest as exc:
                sweep.phase, sweep.message = "Failed", f"trial refused: {exc}"

    def tick(self) -> None:
        changed = False
        for sweep in self.sweeps.values():
            if sweep.phase != "Running":
                continue
            for wid, index in list(sweep.running.items()):
                got = self._phase_of(wid)
                phase = got[0] if got else "Deleted"
                if phase not in (*FINISHED, "Deleted"):
                    continue
                changed = True
                del sweep.running[wid]
                if phase == "Completed":
                    sweep.done.append(index)
                elif sweep.retries < sweep.backoff_limit:
                    sweep.retries += 1
                    sweep.queue.insert(0, index)
                else:
                    sweep.phase = "Failed"
                    sweep.message = (f"trial {index} {phase.lower()}"
                                     f"{': ' + got[1] if got else ''}; backoffLimit "
                                     f"{sweep.backoff_limit} reached")
            if sweep.phase == "Running" and len(sweep.done) == sweep.completions:
                sweep.phase, sweep.message, changed = "Completed", "every trial exited 0", True
            before = len(sweep.running)
            self._fill(sweep)
            changed = changed or len(sweep.running) != before
        if changed:
            self._save()

    def doc(self, sweep: Sweep) -> dict[str, Any]:
        return {"name": sweep.name, "project": sweep.project, "phase": sweep.phase,
                "message": sweep.message, "parallelism": sweep.parallelism,
                "completions": sweep.completions, "backoffLimit": sweep.backoff_limit,
                "succeeded": len(sweep.done), "active": len(sweep.running),
                "retries": sweep.retries, "peakActive": sweep.peak, "at": time.time()}

    def get(self, project: str, name: str) -> dict[str, Any] | None:
        s = self.sweeps.get(f"{project}/{name}")
        return None if s is None else self.doc(s)

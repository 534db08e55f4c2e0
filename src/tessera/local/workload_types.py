"""The workload types embedded mode runs on top of plain workloads: sweeps
(:mod:`tessera.local.sweeps`), inference that scales (:mod:`tessera.local.inference`) and
elastic trainings that resize while they run (:mod:`tessera.local.elastic`). One seam for the
backend: :meth:`route` takes a submission of one of these types, :meth:`tick` runs in every
control cycle (docs/workloads.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tessera.api.backend import WorkloadSubmission
from tessera.core.errors import InvalidRequest
from tessera.local import elastic, exposed_urls, inference, sweeps


class WorkloadTypes:
    def __init__(self, data_dir: Path, submit: Callable[[WorkloadSubmission], dict[str, Any]],
                 delete: Callable[[str], None], lookup: Callable[[str], Any],
                 wake: Callable[[], None] | None, resizing: elastic.ElasticPods) -> None:
        """``lookup``: a workload id -> its stored workload (``phase``, ``phase_message``) or
        None once deleted; ``wake``: run a control cycle soon."""
        def phase_of(wid: str) -> tuple[str, str] | None:
            w = lookup(wid)
            return None if w is None else (w.phase, w.phase_message)

        self.sweeps = sweeps.Sweeps(data_dir / "sweeps.json", submit, phase_of)
        """Hyperparameter sweeps: trials P at a time (--parallelism/--completions)."""
        self.services = inference.Services(submit, delete, phase_of, wake)
        """Inference replicas behind one local port, scaled on a metric."""
        self.urls = exposed_urls.ExposedUrls()
        """Ports reached on the machine's external address (--external-url)."""
        self.elastic = resizing
        """Running elastic trainings grown and shrunk by single pods (the cycle's plan)."""
        self._submit = submit
        self._phase_of = phase_of

    def route(self, s: WorkloadSubmission) -> dict[str, Any] | None:
        """The answer for a sweep or a scaling inference (None: a plain workload, an elastic
        one checked here)."""
        elastic.check_submission(s)
        if self.urls.wanted(s):
            if s.spec.get("autoscaling") is not None or s.spec.get("completions") is not None:
                raise InvalidRequest("spec.ports[0].externalUrl", "is for a workspace, a "
                                     "training or an inference of one pod; an inference that "
                                     "scales or a sweep has no one pod to reach")
            return self.urls.submit(s, self._submit)
        if s.spec.get("autoscaling") is not None:
            if s.type != "Inference":
                raise InvalidRequest("spec.autoscaling", "only an inference scales (tessera "
                                     "inference submit)")
            return self.services.create(s, s.spec["autoscaling"])
        if s.spec.get("completions") is not None:
            return self.sweeps.create(s, s.spec.get("parallelism") or 1, s.spec["completions"],
                                      s.spec.get("backoffLimit", sweeps.DEFAULT_BACKOFF_LIMIT))
        return None

    def describe(self, workload_id: str) -> dict[str, Any]:
        """What a workload's GET adds: a scaling inference's replica shows its service
        (``inference``: replicas, metric, scaling history, ``lowerNeedSince``, ``scaleDownDue``).
        """
        doc = self.services.of_replica(workload_id)
        return {} if doc is None else {"inference": doc}

    def tick(self) -> None:
        self.elastic.tick()
        self.sweeps.tick()
        self.services.tick()
        self.urls.tick(self._phase_of)

    def stop(self) -> None:
        self.services.stop()
        self.urls.stop()

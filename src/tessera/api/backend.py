"""What the API needs from a backend. Embedded mode implements it in ``tessera.local.control``,
Kubernetes in ``tessera.kube.api_backend``.

Payloads are JSON-ready dicts in the API's shape (camelCase), so a backend for Kubernetes can
produce the same documents without sharing the local store's types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from tessera.core.errors import TesseraError
from tessera.core.model import GpuRequest


class NotFound(TesseraError):
    """No such object (404)."""


class Conflict(TesseraError):
    """The name is taken, or the object is in a state that forbids the change (409)."""


class Upstream(TesseraError):
    """What the backend relies on failed: the API server, or a node's kubelet behind it (502)."""


@dataclass
class WorkloadSubmission:
    name: str
    project: str
    type: str
    """``Training``, ``Workspace`` or ``Inference``."""
    gpu: GpuRequest
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    image: str = ""
    working_dir: str | None = None
    priority_class: str | None = None
    workers: int = 1
    min_workers: int | None = None
    spec: dict[str, Any] = field(default_factory=dict)
    """The request body's ``spec`` as given, kept for display."""
    mig_profile: str | None = None
    """A MIG partition (canonical profile name, ``3g.20gb``) instead of ``gpu``."""
    compute: tuple[object, object, object] = (None, None, None)
    """Compute share as given: gpuComputeRequest, gpuComputeLimit, gpuComputeMode (unchecked)."""


@dataclass(frozen=True)
class WorkloadQuery:
    """One page of the workload listing, as the API's query parameters ask for it."""

    filters: tuple[tuple[str, str, str], ...] = ()
    """(key, ``==``/``!=``/``=@``, value), all of which must hold."""
    search: str | None = None
    sort_by: str = "createdAt"
    descending: bool = False
    offset: int = 0
    limit: int = 50
    fields: tuple[str, ...] | None = None
    """Only these keys of each brief document (None: all)."""
    rows: bool = False
    """Each workload an array of ``fields`` in that order, instead of an object."""


@dataclass
class ProjectFields:
    name: str
    deserved: float = 0.0
    limit: float | None = None
    over_quota_weight: float = 1.0
    priority: int = 50


class Backend(Protocol):
    def cluster(self) -> dict[str, Any]: ...

    def upstream(self, exc: Exception) -> Upstream | None:
        """What an error nothing else caught means to a client, when it comes from what the
        backend relies on (the Kubernetes API server unreachable, a resource type not
        installed); None for a fault of tessera itself (answered 500)."""
        ...

    def simulated(self) -> bool:
        """Whether the GPUs are simulated (said in every listing); cheaper than ``cluster``."""
        ...

    def authenticate(self, client_id: str, secret: str) -> bool: ...

    def issue_token(self, client_id: str) -> tuple[str, float]: ...

    def token_valid(self, token: str) -> bool: ...

    def revoke_token(self, token: str) -> bool: ...

    def create_project(self, fields: ProjectFields) -> dict[str, Any]: ...

    def projects(self) -> list[dict[str, Any]]: ...

    def project(self, id_or_name: str) -> dict[str, Any]: ...

    def update_project(self, id_or_name: str, fields: ProjectFields) -> dict[str, Any]: ...

    def delete_project(self, id_or_name: str) -> None: ...

    def submit(self, submission: WorkloadSubmission) -> dict[str, Any]: ...

    def workloads_json(self, query: WorkloadQuery) -> tuple[str, int]:
        """One page of workloads as JSON array text (brief documents, or only ``fields``; with
        ``rows``, each workload an array of ``fields`` in that order), and the total matching.

        Text rather than dicts so a backend can build large listings without Python objects.
        """
        ...

    def workload(self, workload_id: str, kind: str | None = None) -> dict[str, Any]: ...

    def delete_workload(self, workload_id: str, kind: str | None = None) -> None: ...

    def suspend(self, workload_id: str, kind: str | None = None) -> dict[str, Any]: ...

    def resume(self, workload_id: str, kind: str | None = None) -> dict[str, Any]: ...

    def logs(self, workload_id: str, pod: int, offset: int) -> tuple[bytes, int]: ...

    def pods(self, workload_id: str) -> list[dict[str, Any]]: ...

    def exec_command(self, workload_id: str, pod: int, command: list[str],
                     timeout: float) -> dict[str, Any]:
        """Run ``command`` in the pod's environment: ``{exitCode, stdout, stderr}``."""
        ...

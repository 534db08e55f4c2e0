"""The shape of a pod in an AdmissionReview, checked before any rule reads it.

The API server only sends well-formed pods, but the webhook's port is reachable by anything in
the cluster network: a review whose pod has a number where an object belongs is refused here,
naming the field, instead of failing inside a rule (which would refuse it too, but as an
"internal error" that names nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.core.errors import InvalidRequest
from tessera.core.text import MAX_ARG, check_text

_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
MAX_CONTAINERS = 256
"""Containers of all kinds in one pod. Kubernetes sets no number, but every rule reads each
container: the bound keeps one review's cost small, so no pod (20,000 containers fit in the
API server's 3 MiB) holds the webhook while every other GPU pod waits."""
MAX_CONTAINER_ENV = 1024
"""``env`` plus ``envFrom`` entries of one container (the same bound as a workload's)."""
MAX_POD_ENV = 4096
"""``env`` plus ``envFrom`` entries of all the pod's containers together: with the two bounds
above alone a pod could still carry 262,144 entries within the body limit."""


def _object(value: Any, field: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidRequest(field, "must be an object", type(value).__name__)
    return value


def _list(value: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest(field, "must be a list", type(value).__name__)
    return value


def _strings(value: Any, field: str) -> None:
    for key, v in _object(value, field).items():
        if not isinstance(v, str):
            raise InvalidRequest(f"{field}[{key}]", "must be a string", type(v).__name__)
        check_text(v, f"{field}[{key}]", MAX_ARG)


def check_pod_shape(pod: Any) -> None:
    """Refuse a pod whose fields the rules read are not of the types Kubernetes gives them."""
    pod = _object(pod, "object")
    meta = _object(pod.get("metadata"), "metadata")
    _strings(meta.get("annotations"), "metadata.annotations")
    _strings(meta.get("labels"), "metadata.labels")
    if not isinstance(meta.get("name", ""), str):
        raise InvalidRequest("metadata.name", "must be a string")
    spec = _object(pod.get("spec"), "spec")
    if not isinstance(spec.get("schedulerName", ""), str):
        raise InvalidRequest("spec.schedulerName", "must be a string")
    lists = {kind: _list(spec.get(kind), f"spec.{kind}") for kind in _CONTAINER_LISTS}
    count = sum(len(v) for v in lists.values())
    if count > MAX_CONTAINERS:
        raise InvalidRequest("spec.containers", f"a pod may have at most {MAX_CONTAINERS} "
                             "containers (containers, initContainers and ephemeralContainers "
                             f"together) for the tessera webhook to review it (got {count})")
    total_env = sum(len(c.get("env") or []) + len(c.get("envFrom") or [])
                    for items in lists.values() for c in items
                    if isinstance(c, Mapping) and isinstance(c.get("env") or [], list)
                    and isinstance(c.get("envFrom") or [], list))
    if total_env > MAX_POD_ENV:
        raise InvalidRequest("spec.containers[*].env", f"a pod may have at most {MAX_POD_ENV} "
                             "env and envFrom entries in all its containers together for the "
                             f"tessera webhook to review it (got {total_env})")
    for kind, items in lists.items():
        for i, c in enumerate(items):
            path = f"spec.{kind}[{i}]"
            c = _object(c, path)
            if not isinstance(c.get("name", ""), str):
                raise InvalidRequest(f"{path}.name", "must be a string")
            env, env_from = _list(c.get("env"), f"{path}.env"), \
                _list(c.get("envFrom"), f"{path}.envFrom")
            if len(env) + len(env_from) > MAX_CONTAINER_ENV:
                raise InvalidRequest(f"{path}.env", f"a container may have at most "
                                     f"{MAX_CONTAINER_ENV} env and envFrom entries for the "
                                     f"tessera webhook to review it (got "
                                     f"{len(env) + len(env_from)})")
            for j, e in enumerate(env):
                e = _object(e, f"{path}.env[{j}]")
                if not isinstance(e.get("name"), str):
                    raise InvalidRequest(f"{path}.env[{j}].name", "must be a string")
                if not isinstance(e.get("value", ""), str):
                    raise InvalidRequest(f"{path}.env[{j}].value", "must be a string")
                _object(e.get("valueFrom"), f"{path}.env[{j}].valueFrom")
            for j, e in enumerate(env_from):
                e = _object(e, f"{path}.envFrom[{j}]")
                if not isinstance(e.get("prefix", ""), str):
                    raise InvalidRequest(f"{path}.envFrom[{j}].prefix", "must be a string")
            res = _object(c.get("resources"), f"{path}.resources")
            _object(res.get("limits"), f"{path}.resources.limits")
            _object(res.get("requests"), f"{path}.resources.requests")
            _object(c.get("securityContext"), f"{path}.securityContext")
            for j, m in enumerate(_list(c.get("volumeMounts"), f"{path}.volumeMounts")):
                _object(m, f"{path}.volumeMounts[{j}]")
    for j, v in enumerate(_list(spec.get("volumes"), "spec.volumes")):
        _object(v, f"spec.volumes[{j}]")

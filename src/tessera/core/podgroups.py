"""The group every process of a pod's GPU-share container has: the owner group of its region.

The pod's accounting region (``/run/tessera/gpu-usage.region``, docs/isolation.md) must be
writable by every process of the workload, whatever UID each runs as, and by nobody else. So
tessera-node makes it ``root:GROUP``, mode 0660, in a ``2770`` directory, GROUP being a group the
container runtime gives every process of the share container (Kubernetes semantics):

1. the pod's ``securityContext.fsGroup`` (added to every container's supplementary groups);
2. else the first of the pod's ``securityContext.supplementalGroups`` (likewise);
3. else the container's ``securityContext.runAsGroup``, else the pod's (the primary group).

A pod that states none of them gets a supplemental group from the admission webhook
(:data:`DEFAULT_REGION_GROUP`, ``tessera-webhook --region-group``), so one always exists.
Pure: reads a pod spec as the API sends it (camelCase JSON), does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEFAULT_REGION_GROUP = 61000
"""The supplemental group the webhook adds to a share pod that states no group (below 65536, so
it also exists in pods with a user namespace, ``hostUsers: false``)."""

MAX_GID = 2**32 - 2
"""The largest valid group id (2^32-1 is ``(gid_t)-1``, "no change", to the kernel)."""


def valid_gid(value: Any) -> int | None:
    """``value`` as a group id, or None when it is not one (a bool, a string, out of range)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GID:
        return None
    return value


def share_group(pod_spec: Mapping[str, Any], container: str) -> int | None:
    """The group every process of ``container`` runs with (rules above), or None if the pod
    states none."""
    sc = pod_spec.get("securityContext") or {}
    if not isinstance(sc, Mapping):
        sc = {}
    fs = valid_gid(sc.get("fsGroup"))
    if fs is not None:
        return fs
    supplemental = sc.get("supplementalGroups") or []
    if isinstance(supplemental, list):
        for g in supplemental:
            gid = valid_gid(g)
            if gid is not None:
                return gid
    for kind in ("containers", "initContainers"):
        for c in pod_spec.get(kind) or []:
            if isinstance(c, Mapping) and c.get("name") == container:
                csc = c.get("securityContext") or {}
                gid = valid_gid(csc.get("runAsGroup")) if isinstance(csc, Mapping) else None
                if gid is not None:
                    return gid
    return valid_gid(sc.get("runAsGroup"))

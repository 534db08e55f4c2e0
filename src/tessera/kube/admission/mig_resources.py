"""The GPU operator's MIG resources (``nvidia.com/mig-3g.20gb: 1``) as dynamic MIG requests.

A manifest written for the GPU operator asks for a MIG partition as an extended resource. Where
the GPU operator's static partitions serve that resource (some node advertises it), the pod is
left to them, as before. Where no node advertises it but a GPU an operator put in MIG mode has
the profile (tessera-node's inventory), tessera makes the partition on demand: the webhook turns
the resource into ``tessera.io/gpu-mig-profile`` on the pod and takes it out of the container
(a kubelet would otherwise refuse the pod for a resource its node does not have), and the
partition's UUID goes to the container that asked (docs/mig.md).

``WebhookConfig.operator_mig``: ``auto`` (the rule above), ``dynamic`` (always tessera's
partitions), ``static`` (never rewrite: the operator's device plugin serves them).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tessera.core.errors import InvalidRequest
from tessera.core.mig import parse_profile
from tessera.kube import names
from tessera.kube.admission import spellings as sp

MODES = ("auto", "dynamic", "static")


@dataclass(frozen=True)
class MigOffer:
    """What the cluster offers: the GPU operator MIG resources some node advertises, and the
    profiles some GPU in MIG mode could be cut into by tessera."""

    advertised: frozenset[str] = frozenset()
    dynamic_profiles: frozenset[str] = frozenset()


def _asked(pod: Mapping[str, Any]) -> list[tuple[sp.ContainerRef, str, str, Any]]:
    """(container, resource, where, quantity) for each MIG resource a container asks."""
    out = []
    for ref, c in sp.all_containers(pod.get("spec") or {}):
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            for key, value in (res.get(part) or {}).items():
                if str(key).startswith(names.MIG_RESOURCE_PREFIX):
                    out.append((ref, str(key), f"{ref.path}.resources.{part}.{key}", value))
    return out


def rewrite(pod: Mapping[str, Any], mode: str, offer: MigOffer
            ) -> tuple[dict[str, Any], sp.ContainerRef] | None:
    """The pod with its GPU operator MIG resource turned into a dynamic MIG request (the
    annotation), and the container that asked (it gets the partition's UUID); None when it asks
    for none or the operator's partitions serve it. Raises InvalidRequest naming the field when
    one dynamic partition cannot serve it."""
    asked = _asked(pod)
    if not asked or mode == "static":
        return None
    ref, key, where, _ = asked[0]
    profile = parse_profile(key, where)
    if mode == "auto" and (key in offer.advertised or profile not in offer.dynamic_profiles):
        return None
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    if names.MIG_PROFILE in ann:
        raise InvalidRequest(where, f"give a MIG partition either as {key} or as the annotation "
                                    f"{names.MIG_PROFILE}, not both", ann[names.MIG_PROFILE])
    for other_ref, other_key, other_where, value in asked:
        if other_ref != ref or other_key != key:
            raise InvalidRequest(other_where, "tessera makes one MIG partition per pod (dynamic "
                                              f"MIG); this pod also asks {where}", value)
        if str(value) != "1":
            raise InvalidRequest(other_where, "must be 1: tessera makes one MIG partition per "
                                              "pod (dynamic MIG); run one pod per partition",
                                 value)
    out: dict[str, Any] = copy.deepcopy(dict(pod))
    meta = out.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), names.MIG_PROFILE: profile}
    container = out["spec"][ref.kind][ref.index]
    res = container.get("resources") or {}
    for part in ("limits", "requests"):
        if part in res:
            res[part] = {k: v for k, v in res[part].items() if k != key}
            if not res[part]:
                del res[part]
    return out, ref

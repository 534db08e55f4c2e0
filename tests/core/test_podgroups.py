"""The group every process of a share container runs with (owner group of the pod's region)."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.core.podgroups import MAX_GID, share_group, valid_gid


def spec(pod_sc: dict[str, Any] | None = None, container_sc: dict[str, Any] | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "main", "image": "x"}
    if container_sc is not None:
        c["securityContext"] = container_sc
    out: dict[str, Any] = {"containers": [{"name": "side", "securityContext": {"runAsGroup": 9}}, c]}
    if pod_sc is not None:
        out["securityContext"] = pod_sc
    return out


@pytest.mark.parametrize(("pod_sc", "container_sc", "group"), [
    ({"fsGroup": 2000, "supplementalGroups": [3000], "runAsGroup": 4000}, {"runAsGroup": 5000}, 2000),
    ({"supplementalGroups": [3000, 3001], "runAsGroup": 4000}, {"runAsGroup": 5000}, 3000),
    ({"runAsGroup": 4000}, {"runAsGroup": 5000}, 5000),  # the container's own overrides the pod's
    ({"runAsGroup": 4000}, None, 4000),
    ({"runAsGroup": 0}, None, 0),
    ({"runAsUser": 1000}, {"runAsUser": 1001}, None),  # users but no group: the webhook adds one
    (None, None, None),  # the "side" container's group is not main's
])
def test_share_group_follows_the_runtime_rules(pod_sc, container_sc, group) -> None:
    assert share_group(spec(pod_sc, container_sc), "main") == group


def test_init_containers_count_too() -> None:
    s = {"initContainers": [{"name": "main", "securityContext": {"runAsGroup": 7}}], "containers": []}
    assert share_group(s, "main") == 7


@pytest.mark.parametrize("value", [True, "1000", -1, MAX_GID + 1, 1.5, None])
def test_values_that_are_not_group_ids_are_ignored(value) -> None:
    assert valid_gid(value) is None
    assert share_group(spec({"fsGroup": value, "supplementalGroups": [value]}), "main") is None


def test_malformed_security_contexts_state_no_group() -> None:
    assert share_group({"securityContext": "x", "containers": [{"name": "main", "securityContext": 3}]},
                       "main") is None
    assert share_group({"securityContext": {"supplementalGroups": "1000"}}, "main") is None

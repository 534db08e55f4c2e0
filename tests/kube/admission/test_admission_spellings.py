"""The spelling translation as pure functions (no cluster): every spelling of the same request
reads back, through the scheduler's parser, as the same GpuRequest."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuRequest
from tessera.core.units import GiB, MiB
from tessera.kube import names
from tessera.kube.admission import mutate, policy, spellings
from tessera.kube.admission.policy import WebhookConfig
from tessera.kube.podspec import gpu_request
from tests.kube.spelling_helpers import VIEW, pod


def canonical(t: spellings.Translation) -> GpuRequest:
    return gpu_request({k: v for k, v in t.annotations.items()
                        if k in spellings.CANONICAL_SHARE}, [])


portions = st.integers(1, 999).map(lambda n: Decimal(n) / 1000)


@given(portions, st.integers(1, 8), st.booleans())
def test_runai_fraction_equals_tessera_portion(p: Decimal, devices: int, limit: bool) -> None:
    ann = {"gpu-fraction": str(p), "gpu-fraction-num-devices": str(devices)}
    if limit:
        ann["gpu-fraction-limit"] = "1"
    t = spellings.translate(pod(ann))
    expected = GpuRequest.fraction(p, devices, Decimal(1) if limit else None)
    assert t.request == expected == canonical(t)
    again = spellings.translate(pod({k: v for k, v in t.annotations.items()}))
    assert again.request == expected


@given(st.integers(1, 81559), st.integers(0, 4000))
def test_runai_memory_is_mib(mib: int, extra: int) -> None:
    t = spellings.translate(pod({"gpu-memory": str(mib), "gpu-memory-limit": str(mib + extra)}))
    assert t.request == GpuRequest.of_memory(mib * MiB, limit=(mib + extra) * MiB) == canonical(t)


@given(st.integers(1, 8), st.integers(1, 10))
def test_cgpu_total_over_count(count: int, per_gpu_gib: int) -> None:
    t = spellings.translate(pod(labels={"aliyun.com/gpu-count": str(count)},
                                resources={"limits": {"aliyun.com/gpu-mem": count * per_gpu_gib}}))
    assert t.request == GpuRequest.of_memory(per_gpu_gib * GiB, devices=count) == canonical(t)
    assert t.static_env == {"ALIYUN_COM_GPU_MEM_CONTAINER": str(per_gpu_gib)}


@given(st.integers(2, 8), st.integers(1, 64))
def test_cgpu_uneven_split_is_refused(count: int, total: int) -> None:
    manifest = pod(labels={"aliyun.com/gpu-count": str(count)},
                   resources={"limits": {"aliyun.com/gpu-mem": total}})
    if total % count:
        with pytest.raises(InvalidRequest, match="must divide evenly"):
            spellings.translate(manifest)
    else:
        assert spellings.translate(manifest).request.devices == count


def test_runai_env_limit_follows_the_request_kind() -> None:
    env = [{"name": "RUNAI_GPU_MEMORY_LIMIT", "value": "0.75"}]
    t = spellings.translate(pod({"gpu-fraction": "0.25"}, env=env))
    assert t.annotations[names.GPU_PORTION_LIMIT] == "0.75"
    with pytest.raises(InvalidRequest, match=r"env\[RUNAI_GPU_MEMORY_LIMIT\]: must be a Kubernetes quantity"):
        spellings.translate(pod({"gpu-memory": "4000"}, env=[
            {"name": "RUNAI_GPU_MEMORY_LIMIT", "value": "lots"}]))


def test_mutated_pod_passes_its_own_validation_and_is_stable() -> None:
    """What the mutating webhook produces is what the validating webhook accepts, and the patch
    applied to the original gives exactly that pod."""
    for manifest in (pod({"gpu-fraction": "0.5"}), pod({"gpu-memory": "5000"}),
                     pod(labels={"aliyun.com/gpu-count": "4"},
                         resources={"limits": {"aliyun.com/gpu-mem": 8}}),
                     pod({names.GPU_PORTION: "0.3", names.GPU_DEVICES: "2"})):
        manifest["spec"]["containers"].append({"name": "side", "image": "busybox"})
        out = mutate.mutated(manifest, "ns", VIEW, WebhookConfig())
        assert out is not None
        policy.check_final(out, "ns", VIEW, WebhookConfig())
        patched = {"metadata": dict(manifest["metadata"]), "spec": dict(manifest["spec"])}
        for op in mutate.json_patch(manifest, out):
            section, key = op["path"].strip("/").split("/")
            patched[section][key.replace("~1", "/").replace("~0", "~")] = op["value"]
        assert patched == out


def test_pods_without_gpu_are_left_alone() -> None:
    assert mutate.mutated(pod(), "ns", VIEW, WebhookConfig()) is None
    assert mutate.mutated(pod({"example.com/a": "b"}), "ns", VIEW, WebhookConfig()) is None


@pytest.mark.parametrize(("pod_sc", "container_sc", "groups"), [
    (None, None, [61000]),                                  # no group stated: one is added
    ({"runAsUser": 1000, "supplementalGroups": []}, None, [61000]),
    ({"fsGroup": 2000}, None, None),                         # stated: left alone
    ({"supplementalGroups": [3000]}, None, [3000]),
    (None, {"runAsGroup": 5000}, None),
])
def test_share_pods_always_have_a_group_for_their_region(pod_sc, container_sc, groups) -> None:
    """tessera-node gives the pod's region (0660) to the group every process of the share
    container has (tessera.core.podgroups); the webhook adds one where the pod states none."""
    from tessera.core.podgroups import share_group

    manifest = pod({"gpu-fraction": "0.5"}, **({"securityContext": container_sc} if container_sc else {}))
    if pod_sc is not None:
        manifest["spec"]["securityContext"] = pod_sc
    out = mutate.mutated(manifest, "ns", VIEW, WebhookConfig())
    assert out is not None
    assert (out["spec"].get("securityContext") or {}).get("supplementalGroups") == groups
    assert share_group(out["spec"], "main") is not None
    policy.check_final(out, "ns", VIEW, WebhookConfig())
    custom = mutate.mutated(manifest, "ns", VIEW, WebhookConfig(region_group=4242))
    assert custom is not None and share_group(custom["spec"], "main") == (
        4242 if groups == [61000] else share_group(out["spec"], "main"))


def test_region_group_flag_is_checked() -> None:
    from tessera.kube.admission.__main__ import parser

    base = ["--cert", "c", "--key", "k"]
    assert parser().parse_args(base).region_group == 61000
    assert parser().parse_args([*base, "--region-group", "5000"]).region_group == 5000
    for bad in ("-1", "x", "4294967295", "²"):
        with pytest.raises(SystemExit):
            parser().parse_args([*base, "--region-group", bad])

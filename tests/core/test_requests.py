from decimal import Decimal

import pytest

from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuDevice, GpuKind, GpuRequest, Node, ResourceRequest
from tessera.core.requests import (
    cgpu_request,
    check_against_cluster,
    parse_gpu_request,
    parse_models,
)
from tessera.core.units import GiB


def v100_node(name: str = "n1", gpus: int = 4) -> Node:
    return Node(name, tuple(GpuDevice(f"GPU-{name}-{i}", i, 16 * GiB, "V100M16") for i in range(gpus)), 32000, 128 * GiB)


def test_short_gpu_flag_is_portion_below_one_and_count_above() -> None:
    half = parse_gpu_request(gpu="0.5")
    assert half.kind is GpuKind.PORTION and half.portion == Decimal("0.5") and half.devices == 1
    two = parse_gpu_request(gpu="2")
    assert two.kind is GpuKind.WHOLE and two.devices == 2


def test_memory_request_per_device() -> None:
    r = parse_gpu_request(gpu_memory="5G")
    assert r.kind is GpuKind.MEMORY and r.memory == 5 * 10**9
    assert r.bytes_on(16 * 10**9) == 5 * 10**9
    assert r.gpus_on(80 * 10**9) == pytest.approx(0.0625)


def test_multi_device_memory_request() -> None:
    r = parse_gpu_request(gpu_devices=4, gpu_memory="2Gi")
    assert (r.kind, r.devices, r.memory) == (GpuKind.MEMORY, 4, 2 * GiB)
    assert r.gpus_on(16 * GiB) == pytest.approx(0.5)


def test_multi_device_portion_request() -> None:
    r = parse_gpu_request(gpu_devices="2", gpu_portion="0.25")
    assert (r.kind, r.devices, r.portion) == (GpuKind.PORTION, 2, Decimal("0.25"))
    assert r.gpus_on(16 * GiB) == pytest.approx(0.5)


def test_dynamic_fractions_keep_request_and_limit() -> None:
    r = parse_gpu_request(gpu_portion="0.25", gpu_portion_limit="0.8")
    assert r.bytes_on(100) == 25 and r.limit_bytes_on(100) == 80
    m = parse_gpu_request(gpu_memory="4G", gpu_memory_limit="8G")
    assert m.bytes_on(16 * 10**9) == 4 * 10**9 and m.limit_bytes_on(16 * 10**9) == 8 * 10**9
    assert m.limit_bytes_on(6 * 10**9) == 6 * 10**9  # never above the device


def test_no_limit_means_limit_equals_request() -> None:
    r = parse_gpu_request(gpu="0.5")
    assert r.limit_bytes_on(1000) == r.bytes_on(1000) == 500


def test_cgpu_divides_total_over_devices() -> None:
    r = cgpu_request(8, "4")
    assert (r.kind, r.devices, r.memory) == (GpuKind.MEMORY, 4, 2 * GiB)


def test_model_constraints() -> None:
    assert parse_models("V100M16|V100M32") == frozenset({"V100M16", "V100M32"})
    r = parse_gpu_request(gpu="1", gpu_model="V100M16|V100M32")
    assert r.allows("V100M32") and not r.allows("T4")
    assert parse_models("V100M16|V100M32|V100M32") == frozenset({"V100M16", "V100M32"})
    assert parse_models("") == frozenset()
    for bad in ("V100M16||T4", "|T4", "T4|"):
        with pytest.raises(InvalidRequest, match="gpu_model: must be model names"):
            parse_models(bad)


def test_errors_survive_pickling() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(InvalidRequest("gpu", "must be positive", -1)))
    assert (err.field, err.rule, err.value, str(err)) == ("gpu", "must be positive", -1, "gpu: must be positive (got -1)")


def test_no_gpu() -> None:
    assert parse_gpu_request().kind is GpuKind.NONE


@pytest.mark.parametrize(
    ("fields", "field", "rule"),
    [
        ({"gpu": "0"}, "gpu", "GPU portion in (0, 1)"),
        ({"gpu": "1.5"}, "gpu", "whole number of GPUs"),
        ({"gpu": "-0.2"}, "gpu", "GPU portion in (0, 1)"),
        ({"gpu": "abc"}, "gpu", "GPU portion in (0, 1)"),
        ({"gpu_portion": "0"}, "gpu_portion", "(0, 1)"),
        ({"gpu_portion": "1.5"}, "gpu_portion", "(0, 1)"),
        ({"gpu_portion": "-0.2"}, "gpu_portion", "(0, 1)"),
        ({"gpu_portion": "abc"}, "gpu_portion", "(0, 1)"),
        ({"gpu_memory": "0"}, "gpu_memory", "greater than 0"),
        ({"gpu_memory": "5X"}, "gpu_memory", "Kubernetes quantity"),
        ({"gpu_portion": "0.5", "gpu_memory": "5G"}, "gpu_memory", "not both"),
        ({"gpu": "0.5", "gpu_memory": "5G"}, "gpu", "not both"),
        ({"gpu_portion": "0.5", "gpu_portion_limit": "0.4"}, "gpu_portion_limit", "at least the request"),
        ({"gpu_memory": "8G", "gpu_memory_limit": "4G"}, "gpu_memory_limit", "at least the request"),
        ({"gpu_portion_limit": "0.8"}, "gpu_portion_limit", "needs a portion request"),
        ({"gpu_memory_limit": "8G"}, "gpu_memory_limit", "needs a memory request"),
        ({"gpu_devices": "0"}, "gpu_devices", "1 or more"),
        ({"gpu_devices": "two", "gpu_memory": "1G"}, "gpu_devices", "whole number"),
        ({"gpu": "2", "gpu_portion_limit": "0.5"}, "gpu_portion_limit", "whole GPUs take no limit"),
        ({"gpu": "2", "gpu_devices": "3"}, "gpu_devices", "contradicts"),
        ({"gpu_model": "T4"}, "gpu_model", "needs a GPU request"),
    ],
)
def test_bad_input_names_field_and_rule(fields: dict[str, str], field: str, rule: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_gpu_request(**fields)  # type: ignore[arg-type]
    assert err.value.field == field
    assert rule in str(err.value)
    assert str(err.value).startswith(f"{field}: ")


def test_cgpu_must_divide_evenly() -> None:
    with pytest.raises(InvalidRequest, match=r"aliyun.com/gpu-mem: must divide evenly over aliyun.com/gpu-count=3"):
        cgpu_request(8, 3)


def test_invalid_objects_cannot_be_built_directly() -> None:
    with pytest.raises(InvalidRequest, match="gpu_portion"):
        GpuRequest.fraction("1.5")
    with pytest.raises(InvalidRequest, match="gpu_devices"):
        GpuRequest.whole(0)
    with pytest.raises(InvalidRequest, match="cpu"):
        ResourceRequest(cpu_milli=-1)


def test_requests_no_node_could_ever_hold_are_refused() -> None:
    nodes = [v100_node("a", 4), v100_node("b", 2)]
    with pytest.raises(InvalidRequest, match=r"gpu_devices: asks for 8 GPUs on one node; the largest node has 4"):
        check_against_cluster(parse_gpu_request(gpu="8"), nodes)
    with pytest.raises(InvalidRequest, match=r"gpu_memory: is larger than every GPU in the cluster \(largest is 16 GiB\)"):
        check_against_cluster(parse_gpu_request(gpu_memory="20G"), nodes)
    with pytest.raises(InvalidRequest, match=r"gpu_model: no GPU of model A100 in the cluster"):
        check_against_cluster(parse_gpu_request(gpu="1", gpu_model="A100"), nodes)
    with pytest.raises(InvalidRequest, match=r"gpu_devices: asks for 5 GPUs"):
        check_against_cluster(parse_gpu_request(gpu_devices=5, gpu_memory="1G"), nodes)
    check_against_cluster(parse_gpu_request(gpu_devices=4, gpu_memory="2Gi"), nodes)

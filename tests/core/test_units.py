from decimal import Decimal

import pytest

from tessera.core.errors import InvalidRequest
from tessera.core.units import (
    GiB,
    MiB,
    format_bytes,
    parse_aliyun_gpu_mem,
    parse_memory,
    parse_portion,
    parse_runai_gpu_memory,
    portion_bytes,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5G", 5 * 10**9),
        ("5Gi", 5 * 2**30),
        ("2500M", 2_500_000_000),
        ("500000000", 500_000_000),
        (500000000, 500_000_000),
        ("4096Mi", 4 * GiB),
        ("1.5Gi", 3 * 2**29),
        ("1e9", 10**9),
        ("128k", 128_000),
        ("1Ki", 1024),
        (" 8G ", 8 * 10**9),
    ],
)
def test_memory_quantities_follow_kubernetes(text: object, expected: int) -> None:
    assert parse_memory(text, "gpu_memory") == expected


def test_fractional_bytes_round_up() -> None:
    assert parse_memory("0.5", "m") == 1


@pytest.mark.parametrize("bad", ["0", "5X", "abc", "", "-1G", "G", "1.2.3G", True, 0, "5 G"])
def test_bad_memory_names_field_and_rule(bad: object) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_memory(bad, "gpu_memory")
    assert err.value.field == "gpu_memory"
    assert str(err.value).startswith("gpu_memory: must be")


def test_runai_gpu_memory_annotation_is_mib() -> None:
    assert parse_runai_gpu_memory("5000") == 5000 * MiB
    for bad in ("5G", "0", "-5", "1.5", ""):
        with pytest.raises(InvalidRequest, match=r"gpu-memory: must be a positive whole number of MiB"):
            parse_runai_gpu_memory(bad)


def test_aliyun_gpu_mem_is_gib() -> None:
    assert parse_aliyun_gpu_mem(8) == 8 * GiB
    with pytest.raises(InvalidRequest, match=r"aliyun.com/gpu-mem: must be a positive whole number of GiB"):
        parse_aliyun_gpu_mem("8Gi")


@pytest.mark.parametrize("good", ["0.5", "0.25", 0.3, "0.001", Decimal("0.999")])
def test_portions_in_open_unit_interval(good: object) -> None:
    assert 0 < parse_portion(good, "gpu_portion") < 1


@pytest.mark.parametrize("bad", ["0", "1.5", "-0.2", "abc", "1", "nan", "inf", "0.0001", True])
def test_bad_portions(bad: object) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_portion(bad, "gpu_portion")
    assert err.value.field == "gpu_portion"


def test_portion_limit_may_be_whole_gpu() -> None:
    assert parse_portion("1", "gpu_portion_limit", allow_whole=True) == 1
    with pytest.raises(InvalidRequest):
        parse_portion("1.01", "gpu_portion_limit", allow_whole=True)


def test_same_bytes_are_different_portions_of_different_devices() -> None:
    v100 = 16 * 10**9
    h100 = 80 * 10**9
    five_g = parse_memory("5G", "gpu_memory")
    assert five_g / v100 == pytest.approx(0.3125)
    assert five_g / h100 == pytest.approx(0.0625)
    assert portion_bytes(Decimal("0.5"), v100) == 8 * 10**9


def test_portion_bytes_never_overflow_a_device() -> None:
    size = 17_179_869_183  # odd byte count
    assert portion_bytes(Decimal("0.3"), size) + portion_bytes(Decimal("0.7"), size) <= size


def test_format_bytes() -> None:
    # Binary units, as nvidia-smi shows GPU memory (issue #21).
    assert format_bytes(5 * 10**9) == "4.7 GiB"
    assert format_bytes(16 * 2**30) == "16 GiB"
    assert format_bytes(8 * 2**30) == "8 GiB"
    assert format_bytes(2 * 2**30) == "2 GiB"
    assert format_bytes(3_200_000_000) == "3 GiB"
    assert format_bytes(512 * 2**20) == "512 MiB"
    assert format_bytes(10**26) == "8.67e+07 EiB"

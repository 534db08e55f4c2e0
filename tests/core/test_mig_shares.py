"""Shares served by the smallest fitting MIG profile (tessera.core.mig.smallest_fitting,
serving_profile, choose_serving): the units of memory requests, portions of GPUs of two sizes,
what is not eligible, and the choice across GPUs."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tessera.core import mig
from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuRequest


@pytest.mark.parametrize(("model", "memory", "profile"), [
    ("A100-40GB", 5 * 10**9, "1g.5gb"),       # 5G = 4768 MiB <= 4864 MiB
    ("A100-40GB", 5 * 2**30, "1g.10gb"),      # 5Gi = 5120 MiB > 4864 MiB
    ("A100-40GB", 4864 * 2**20, "1g.5gb"),    # exactly the profile's memory
    ("A100-40GB", 4864 * 2**20 + 1, "1g.10gb"),
    ("A100-40GB", 10 * 10**9, "1g.10gb"),     # 1g.10gb before 2g.10gb: fewer compute slices
    ("A100-40GB", 10 * 2**30, "3g.20gb"),     # 3g.20gb before 4g.20gb
    ("A100-40GB", 39 * 2**30, "7g.40gb"),
    ("A100-80GB", 5 * 2**30, "1g.10gb"),
    ("A100-80GB", 10 * 2**30, "1g.20gb"),
    ("H100-80GB", 20 * 10**9, "1g.20gb"),
])
def test_memory_requests_in_kubernetes_units(model: str, memory: int, profile: str) -> None:
    got = mig.smallest_fitting(model, memory=memory)
    assert got is not None and got.name == profile


@pytest.mark.parametrize(("portion", "a100_40", "a100_80"), [
    ("0.1", "1g.5gb", "1g.10gb"),
    ("0.125", "1g.5gb", "1g.10gb"),
    ("0.25", "1g.10gb", "1g.20gb"),
    ("0.3", "3g.20gb", "3g.40gb"),
    ("0.5", "3g.20gb", "3g.40gb"),
    ("0.75", "7g.40gb", "7g.80gb"),
])
def test_portions_of_a_40gb_and_an_80gb_a100(portion: str, a100_40: str, a100_80: str) -> None:
    for model, want in (("A100-40GB", a100_40), ("A100-80GB", a100_80)):
        got = mig.smallest_fitting(model, portion=Decimal(portion))
        assert got is not None and got.name == want, (model, portion)


def test_nothing_fits_or_not_eligible() -> None:
    assert mig.smallest_fitting("A100-40GB", memory=41 * 2**30) is None
    assert mig.smallest_fitting("V100-16GB", portion=Decimal("0.25")) is None  # no MIG
    with pytest.raises(ValueError):
        mig.smallest_fitting("A100-40GB")
    share = GpuRequest.fraction("0.25")
    assert mig.serving_profile(share, "A100-40GB") == mig.PROFILES["A100-40GB"]["1g.10gb"]
    assert mig.serving_profile(GpuRequest.whole(1), "A100-40GB") is None
    assert mig.serving_profile(GpuRequest.fraction("0.25", devices=2), "A100-40GB") is None
    only_h100 = GpuRequest.fraction("0.25", models=frozenset({"H100-80GB"}))
    assert mig.serving_profile(only_h100, "A100-40GB") is None
    # Sized by the request: a burst limit above it does not make the profile larger.
    burst = GpuRequest.of_memory(5 * 10**9, limit=20 * 2**30)
    assert mig.serving_profile(burst, "A100-40GB") == mig.PROFILES["A100-40GB"]["1g.5gb"]


def test_choose_serving_reuses_an_idle_partition_across_models() -> None:
    a40 = mig.MigGpu("n/0", "A100-40GB", (mig.Partition("3g.20gb", 0, True),))
    a80 = mig.MigGpu("n/1", "A100-80GB", (mig.Partition("1g.20gb", 2, False, "MIG-x"),))
    got = mig.choose_serving([a40, a80], GpuRequest.fraction("0.25"))
    assert got is not None
    profile, choice = got
    assert (profile, choice.gpu, choice.reuse) == ("1g.20gb", "n/1", a80.partitions[0])
    # Without the idle one: a free slot on the A100-40GB (packed next to the busy 3g.20gb).
    got = mig.choose_serving([a40], GpuRequest.fraction("0.25"))
    assert got is not None and got[0] == "1g.10gb" and got[1].start >= 4
    full = mig.MigGpu("n/0", "A100-40GB", (mig.Partition("7g.40gb", 0, True),))
    assert mig.choose_serving([full], GpuRequest.fraction("0.25")) is None
    assert mig.choose_serving([a40], GpuRequest.fraction("0.75")) is None


@pytest.mark.parametrize(("value", "want"), [("true", True), ("True", True), ("1", True),
                                             ("yes", True), ("false", False), ("0", False),
                                             (" no ", False)])
def test_the_operators_switch(value: str, want: bool) -> None:
    assert mig.parse_serves_shares(value, "x") is want


@pytest.mark.parametrize("value", ["maybe", "", None, 1])
def test_a_bad_switch_names_where_it_was_written(value: object) -> None:
    with pytest.raises(InvalidRequest, match=r"^TESSERA_MIG_SERVES_SHARES: must be true or false"):
        mig.parse_serves_shares(value, "TESSERA_MIG_SERVES_SHARES")

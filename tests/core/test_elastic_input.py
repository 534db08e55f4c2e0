"""An elastic maximum the cluster could never hold is refused naming spec.workers (--workers);
a fixed gang is not (it waits, told why)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tessera.core.elastic import pods_that_fit
from tessera.core.errors import InvalidRequest
from tessera.core.model import GpuDevice, GpuRequest, Node
from tessera.core.requests import check_against_cluster
from tessera.core.units import GiB

NODES = [Node(f"n{k}", tuple(GpuDevice(f"G{k}{i}", i, 16 * GiB, "T4") for i in range(2))) for k in range(2)]


def test_how_many_workers_an_empty_cluster_holds() -> None:
    assert sum(pods_that_fit(GpuRequest.whole(1), n) for n in NODES) == 4
    assert sum(pods_that_fit(GpuRequest.whole(2), n) for n in NODES) == 2
    assert sum(pods_that_fit(GpuRequest.fraction(Decimal("0.25")), n) for n in NODES) == 16
    assert sum(pods_that_fit(GpuRequest.of_memory(5 * GiB), n) for n in NODES) == 12


def test_an_elastic_maximum_above_the_cluster_is_refused_naming_workers() -> None:
    check_against_cluster(GpuRequest.whole(1), NODES, (1, 4))  # fits exactly
    with pytest.raises(InvalidRequest) as err:
        check_against_cluster(GpuRequest.whole(1), NODES, (2, 5))
    assert err.value.field == "spec.workers" and "could ever hold at once (4 such workers" in str(err.value)
    check_against_cluster(GpuRequest.whole(1), NODES, (5, 5))  # a fixed gang: not refused here

"""tessera.bench.bound: never below what a placement can allocate (checked by exhaustive search)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.bench.bound import aggregated_bound, exact_optimum
from tessera.core.model import GpuDevice, GpuKind, GpuRequest, Node, ResourceRequest
from tessera.core.placement.devices import fitting_devices, host_fits, make_placement
from tessera.core.state import ClusterState
from tessera.core.units import GiB

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "alibaba-gpu-v2023"
NODES = DATA / "openb_node_list_gpu_node.csv"
PODS = DATA / "openb_pod_list_gpuspec20.csv"
MODELS = ("T4", "G3")


def brute_force(nodes: list[Node], pods: list[ResourceRequest]) -> float:
    """The most GPU any placement of a subset of the pods allocates: every choice tried."""
    state = ClusterState(nodes)
    best = 0.0

    def go(i: int) -> None:
        nonlocal best
        if i == len(pods):
            best = max(best, state.gpus_allocated())
            return
        go(i + 1)  # this pod left out
        request = pods[i]
        for ns in state.nodes:
            if not host_fits(ns, request):
                continue
            if request.gpu.kind is GpuKind.NONE:
                options: list[tuple[int, ...]] = [()]
            else:
                options = list(itertools.combinations(fitting_devices(ns, request.gpu), request.gpu.devices))
            for devices in options:
                state.assign(f"p{i}", make_placement(ns, request, devices))
                go(i + 1)
                state.release(f"p{i}")

    go(0)
    return best


@st.composite
def instances(draw: st.DrawFn) -> tuple[list[Node], list[ResourceRequest]]:
    nodes = []
    for n in range(draw(st.integers(1, 2))):
        model = draw(st.sampled_from(MODELS))
        gpus = tuple(GpuDevice(f"g{n}-{i}", i, 16 * GiB, model) for i in range(draw(st.integers(1, 3))))
        nodes.append(Node(f"n{n}", gpus, draw(st.integers(2, 8)) * 1000, 32 * GiB))
    pods = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from((GpuKind.NONE, GpuKind.WHOLE, GpuKind.PORTION, GpuKind.PORTION)))
        models = frozenset(draw(st.sets(st.sampled_from(MODELS), max_size=1)))
        if kind is GpuKind.NONE:
            gpu = GpuRequest.none()
        elif kind is GpuKind.WHOLE:
            gpu = GpuRequest.whole(draw(st.integers(1, 2)), models)
        else:
            gpu = GpuRequest.fraction(Decimal(draw(st.sampled_from((100, 250, 300, 400, 500, 600, 750)))) / 1000,
                                      models=models)
        pods.append(ResourceRequest(gpu, draw(st.integers(0, 4)) * 1000, draw(st.integers(0, 2)) * 8 * GiB))
    return nodes, pods


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_exact_equals_exhaustive_search_and_the_aggregated_bound_is_never_below(
    instance: tuple[list[Node], list[ResourceRequest]],
) -> None:
    nodes, pods = instance
    best = brute_force(nodes, pods)
    exact = exact_optimum(nodes, pods)
    assert exact is not None
    assert exact == pytest.approx(best, abs=1e-6)
    bound, lp, _ = aggregated_bound(nodes, pods)
    assert bound >= best - 1e-6, "the aggregated bound is below a feasible placement"
    assert lp is not None and lp >= bound - 1e-6


def test_the_cuts_make_the_bound_tighter_than_capacity() -> None:
    """Three 0.6-GPU pods on two GPUs: capacity alone says 1.8, one per device gives 1.2."""
    nodes = [Node("n", tuple(GpuDevice(f"g{i}", i, 16 * GiB, "T4") for i in range(2)), 8000, 32 * GiB)]
    pods = [ResourceRequest(GpuRequest.fraction(Decimal("0.6")))] * 3
    bound, _, _ = aggregated_bound(nodes, pods)
    assert bound == pytest.approx(1.2, abs=1e-6)
    assert exact_optimum(nodes, pods) == pytest.approx(1.2, abs=1e-6)


def test_command_prints_one_json_line_and_names_bad_flags() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tessera.bench.bound", "--nodes", str(NODES),
         "--pods", str(PODS), "--seed", "3", "--arrive", "0.5", "--time-limit", "20", "--json"],
        capture_output=True, text=True, check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["method"] == "aggregated" and result["pods_arrived"] > 1000
    assert 0 < result["bound_percent"] <= min(100.0, result["arrived_gpu_percent"]) + 1e-3
    assert 0 < result["offline_percent"] <= result["bound_percent"], "a real placement above the bound"
    bad = subprocess.run([sys.executable, "-m", "tessera.bench.bound", "--nodes", str(NODES),
                          "--pods", str(PODS), "--arrive", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--arrive: must be greater than 0" in bad.stderr

"""The allocation curve of the trace benchmark, and its comparison with the paper's curves."""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

from tessera.bench.fgd_reference import compare, load_reference, render
from tessera.bench.trace import load_nodes, load_pods, run_trace

SHARED = Path(__file__).resolve().parents[3] / "shared"
DATA = SHARED / "data" / "alibaba-gpu-v2023"
REFERENCE = SHARED / "reference" / "fgd-expected-allocation-shared.csv"


def test_curve_has_one_value_per_level_and_agrees_with_the_point_metrics() -> None:
    nodes = load_nodes(DATA / "openb_node_list_gpu_node.csv")[:150]
    result = run_trace(nodes, load_pods(DATA / "openb_pod_list_multigpu20.csv"), "fgd", seed=3, arrive=1.1)
    curve = result.allocation_curve
    assert len(curve) == 111
    assert curve[0] < 1 and all(0 <= v <= 100 for v in curve)
    assert all(b >= a - 0.5 for a, b in pairwise(curve)), "allocation never drops"
    assert all(curve[i] <= i + 1 for i in range(len(curve))), "nothing is allocated before it arrives"
    # the binned value at 100 straddles the moment arrived demand reached 100%
    assert abs((100 - result.unallocated_at_100) - curve[100]) < 1.0
    assert result.unallocated_at_100 == result.unallocated_gpu_percent_at_100


def test_levels_behind_are_flagged() -> None:
    paper = [[50.0, 80.0, 90.0], [50.2, 80.2, 91.0]]  # mean 50.1, 80.1, 90.5; sd 0.1, 0.1, 0.5
    best_fit = [[49.0, 80.15, 85.0]]
    ours = [[50.2, 80.05, 89.9], [50.2, 80.05, 89.9]]
    rows = compare(ours, paper, best_fit, [0, 1, 2])
    assert [r.flag() for r in rows] == ["", "behind FGD (within 1 sd)", "BEHIND FGD (beyond 1 sd)"]
    assert [r.not_above_best_fit for r in rows] == [False, True, False]
    text = "\n".join(render("t", rows, every=100))
    assert "Levels behind FGD beyond one paper sd: 2; behind at all: 1–2" in text


def test_reference_has_every_seed_of_every_trace() -> None:
    ref = load_reference(REFERENCE)
    assert len(ref[("default", "06-FGD")]) == 10
    assert len(ref[("gpuspec20", "05-BestFit")][0]) == 131
    assert abs(100 - sum(c[100] for c in ref[("default", "06-FGD")]) / 10 - 4.77) < 0.01  # the paper's table


def test_table_compares_one_short_trace_with_the_paper() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tessera.bench.trace_table", "--data", str(DATA), "--seeds", "42",
         "--traces", "multigpu20", "--policies", "fgd", "--arrive", "0.6", "--jobs", "1"],
        capture_output=True, text=True, check=True, timeout=300,
    )
    assert "#### multigpu20 (fgd): default policy against the paper" in out.stdout
    assert "| 50 | " in out.stdout and "| 60 | " in out.stdout
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(summary["curves"]["multigpu20"]["fgd"]) == 61
    flagged = summary["results"]["multigpu20"]["fgd"]["levels_behind_fgd_beyond_sd"]
    assert set(flagged) <= set(range(50, 61))
    for level in flagged:
        assert f"| {level} | " in out.stdout


def test_dropped_demand_is_compared_free_of_arrival_noise() -> None:
    """Below saturation tessera may sit a hair under the paper only because other pods arrived:
    it dropped nothing, so it does not drop more. Above, dropping more than FGD is flagged."""
    def curve(at_62: float, at_100: float) -> list[float]:
        return [float(i) for i in range(62)] + [at_62] * 38 + [at_100]

    paper = [curve(62.01, 90.0), curve(62.01, 90.2)]  # FGD dropped 0 at 62 and 9.9 at 100
    ours = [curve(61.95, 89.0)] * 2
    arrived = [curve(61.95, 100.0)] * 2
    rows = compare(ours, paper, None, [62, 100], arrived)
    assert rows[0].behind_beyond_tolerance and not rows[0].loses_more_than_fgd
    assert rows[0].lost == 0.0
    assert rows[1].loses_more_than_fgd and abs(rows[1].lost - 11.0) < 1e-9
    text = "\n".join(render("t", rows, every=100))
    assert "drops more than FGD (beyond 1 sd): 100." in text


def test_arrived_curve_is_never_below_the_allocation_curve() -> None:
    nodes = load_nodes(DATA / "openb_node_list_gpu_node.csv")[:100]
    result = run_trace(nodes, load_pods(DATA / "openb_pod_list_gpushare40.csv"), "fgd", seed=5, arrive=1.2)
    assert len(result.arrived_curve) == len(result.allocation_curve)
    assert all(a >= b - 1e-9 for a, b in zip(result.arrived_curve, result.allocation_curve, strict=True))
    assert all(abs(a - i) <= 1.5 for i, a in enumerate(result.arrived_curve[1:], 1))
    assert result.arrived_curve[-1] - result.allocation_curve[-1] > 5, "a small cluster at 120% drops pods"

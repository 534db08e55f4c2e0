"""A short replay of the real Alibaba trace, through the benchmark's own command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tessera.bench.trace import load_nodes, load_pods, run_trace

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "alibaba-gpu-v2023"
NODES = DATA / "openb_node_list_gpu_node.csv"
PODS = DATA / "openb_pod_list_default.csv"



def test_trace_loads_as_published() -> None:
    nodes = load_nodes(NODES)
    assert len(nodes) == 1213 and sum(len(n.gpus) for n in nodes) == 6212
    pods = load_pods(PODS)
    assert len(pods) == 8152
    fractional = [p for p in pods if 0 < p.gpu_milli < 1000]
    assert len(fractional) == 3078


def test_short_replay_every_policy() -> None:
    nodes = load_nodes(NODES)[:200]
    pods = load_pods(PODS)
    results = {p: run_trace(nodes, pods, p, seed=1, arrive=0.6) for p in ("fgd", "best-fit", "random")}
    for r in results.values():
        assert 0 < r.pods_placed <= r.pods_arrived
        assert 0 < r.gpu_milli_allocated <= r.gpu_milli_total
        assert r.decisions_per_second > 0 and r.decisions_per_cpu_second > 0
    assert results["fgd"].allocation_ratio >= results["random"].allocation_ratio


def test_command_line_prints_json_last() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tessera.bench.trace", "--nodes", str(NODES), "--pods", str(PODS),
         "--policy", "binpack", "--seed", "3", "--arrive", "0.3", "--json"],
        capture_output=True, text=True, check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("policy", "seed", "gpu_milli_total", "gpu_milli_allocated", "allocation_ratio",
                "pods_arrived", "pods_placed", "decisions_per_second", "decisions_per_cpu_second"):
        assert key in result
    assert result["policy"] == "binpack" and result["seed"] == 3
    assert result["gpu_milli_total"] == 6_212_000


def test_command_line_refuses_bad_arguments() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tessera.bench.trace", "--nodes", "/nonexistent.csv", "--pods", str(PODS)],
        capture_output=True, text=True,
    )
    assert out.returncode == 2 and "/nonexistent.csv: no such file" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "tessera.bench.trace", "--nodes", str(NODES), "--pods", str(PODS), "--policy", "x"],
        capture_output=True, text=True,
    )
    assert out.returncode == 2 and "--policy" in out.stderr

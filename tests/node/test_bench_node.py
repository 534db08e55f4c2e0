"""python -m tessera.bench.node runs end to end and its last line is the JSON the issue names."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_node_small_run() -> None:
    r = subprocess.run([sys.executable, "-m", "tessera.bench.node", "--containers", "3",
                        "--gpus", "2", "--scrapes", "3", "--reclaims", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["containers"] == 3 and doc["gpus"] == 2 and doc["reclaims"] == 2
    for key in ("reclaim_p50_seconds", "reclaim_p99_seconds", "scrape_seconds", "rss_bytes"):
        assert isinstance(doc[key], (int, float)) and doc[key] > 0, (key, doc)
    assert doc["reclaim_p50_seconds"] <= doc["reclaim_p99_seconds"]


def test_bench_node_refuses_bad_arguments() -> None:
    r = subprocess.run([sys.executable, "-m", "tessera.bench.node", "--reclaims", "-1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--reclaims" in r.stderr

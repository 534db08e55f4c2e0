"""Hyperparameter sweeps in embedded mode (tessera.local.sweeps): ``tessera submit NAME
--parallelism P --completions C [--backoff-limit B]`` runs trials 0..C-1 with
JOB_COMPLETION_INDEX, at most P at once, retrying failed trials, as an Indexed Job does."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.testing.embedded import EmbeddedServer
from tests.waiting import wait_until

TRIAL = r'''
import json, os, sys, time
out = sys.argv[1]
i = os.environ["JOB_COMPLETION_INDEX"]
t0 = time.time()
time.sleep(float(sys.argv[2]))
fail_once = sys.argv[3] if len(sys.argv) > 3 else ""
marker = os.path.join(out, f"failed-{i}")
if i == fail_once and not os.path.exists(marker):
    open(marker, "w").close()
    sys.exit(3)
with open(os.path.join(out, f"trial-{i}-{os.getpid()}.json"), "w") as f:
    json.dump({"index": int(i), "start": t0, "end": time.time(),
               "sweep": os.environ["TESSERA_SWEEP"]}, f)
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    s = EmbeddedServer(tmp_path_factory.mktemp("sweep"), simulate=["1xV100-16GB"])
    with s.serving("team", gpu="1"):
        yield s


def trials(out: Path) -> list[dict[str, float]]:
    return [json.loads(p.read_text()) for p in out.glob("trial-*.json")]


def most_at_once(runs: list[dict[str, float]]) -> int:
    edges = sorted([(r["start"], 1) for r in runs] + [(r["end"], -1) for r in runs])
    now = peak = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def test_sweep_runs_every_index_at_most_parallelism_at_once(server: EmbeddedServer,
                                                            tmp_path: Path) -> None:
    script = tmp_path / "trial.py"
    script.write_text(TRIAL)
    out = tmp_path / "out"
    out.mkdir()
    got = server.cli("submit", "hpo", "-p", "team", "-g", "0.25", "--parallelism", "2",
                     "--completions", "6", "--working-dir", str(tmp_path), "--",
                     sys.executable, str(script), str(out), "0.4")
    assert "6 trials of" in got.stdout and "2 at a time" in got.stdout
    wait_until("6 trials done", lambda: len(trials(out)) == 6, timeout=60)
    runs = trials(out)
    assert sorted(int(r["index"]) for r in runs) == list(range(6))
    assert {r["sweep"] for r in runs} == {"hpo"}
    # The GPU (4 quarters) could hold 4 trials; the sweep runs 2 at a time.
    assert most_at_once(runs) == 2


def test_failed_trial_is_retried_up_to_the_backoff_limit(server: EmbeddedServer,
                                                         tmp_path: Path) -> None:
    script = tmp_path / "trial.py"
    script.write_text(TRIAL)
    out = tmp_path / "out"
    out.mkdir()
    server.cli("submit", "retry", "-p", "team", "-g", "0.25", "--parallelism", "2",
               "--completions", "3", "--backoff-limit", "1", "--working-dir", str(tmp_path),
               "--", sys.executable, str(script), str(out), "0.1", "1")
    wait_until("3 trials done", lambda: len(trials(out)) == 3, timeout=60)
    names = {w["name"]: w["phase"] for w in server.cli_json("list", "-p", "team")["workloads"]}
    assert names["retry-1"] == "Failed" and names["retry-1-r1"] == "Completed"


def test_no_retry_left_stops_the_sweep(server: EmbeddedServer, tmp_path: Path) -> None:
    script = tmp_path / "trial.py"
    script.write_text(TRIAL)
    out = tmp_path / "out"
    out.mkdir()
    server.cli("submit", "strict", "-p", "team", "-g", "0.25", "--parallelism", "1",
               "--completions", "4", "--backoff-limit", "0", "--working-dir", str(tmp_path),
               "--", sys.executable, str(script), str(out), "0.1", "1")
    wait_until("trial 1 failed", lambda: (out / "failed-1").exists(), timeout=30)
    wait_until("trial 1 seen failed", lambda: {w["name"]: w["phase"] for w in server.cli_json(
        "list", "-p", "team")["workloads"]}.get("strict-1") == "Failed", timeout=30)
    import time
    time.sleep(1.0)  # a few control cycles: no trial after the failure
    names = {w["name"] for w in server.cli_json("list", "-p", "team")["workloads"]}
    assert "strict-2" not in names and "strict-1-r1" not in names
    assert [r["index"] for r in trials(out)] == [0]


@pytest.mark.parametrize(("args", "message"), [
    (["--parallelism", "5", "--completions", "3"],
     "--parallelism: must be at most completions (3)"),
    (["--parallelism", "2"], "--completions: is required with parallelism"),
    (["--backoff-limit", "2"], "--backoff-limit: applies to a sweep"),
    (["--completions", "3", "--workers", "2"], "--workers: must be 1 in a sweep"),
    (["--completions", "0"], "--completions"),
])
def test_bad_sweep_flags_are_named(server: EmbeddedServer, args: list[str], message: str) -> None:
    got = server.cli("submit", "bad", "-p", "team", "-g", "0.25", *args, "--", "true",
                     check=False)
    assert got.returncode != 0 and message in got.stderr, got.stderr

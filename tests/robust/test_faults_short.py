"""The short form of the fault suite (``python -m tessera.bench.faults``) in the test suite:
a few kill -9 trials of each scenario, each checked for the four invariants (nothing
acknowledged lost, no GPU over-committed by the API or by running processes, no duplicate or
untracked pod, every workload placed or explained). The full run is in docs/benchmarks.md."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tessera.bench import faults


@pytest.mark.parametrize(("scenario", "index"), [
    ("burst", 1), ("start", 0), ("start", 2), ("start", 4), ("start", 6), ("start", 1)])
def test_kill_trial_keeps_the_invariants(tmp_path: Path, scenario: str, index: int) -> None:
    result = faults.run_trial(scenario, index, random.Random(index), tmp_path)
    assert result["problems"] == [], result
    if scenario == "burst":
        assert result["acked"] > 0


def test_check_sees_an_untracked_pod(tmp_path: Path) -> None:
    """The invariant check itself can fail: a pod process the server does not know of (started
    behind its back with a pod's environment) is reported."""
    import os
    import subprocess

    trial = faults.Trial(tmp_path / "t")
    trial.start()
    try:
        exit_file = trial.server.data.resolve() / "run" / "stray.exit"
        env = {**os.environ, "TESSERA_EXIT_FILE": str(exit_file),
               "TESSERA_WORKLOAD_ID": "stray", "TESSERA_POD_INDEX": "0"}
        subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
        trial.acked.add("never-stored")
        problems = faults.check(trial, faults.settle(trial))
        assert any("untracked" in p for p in problems), problems
        assert any("lost 1 acknowledged" in p for p in problems), problems
    finally:
        trial.cleanup()


def test_disk_full_trial_loses_nothing_and_half_applies_nothing(tmp_path: Path) -> None:
    """The data directory on a 1 MiB tmpfs, filled through the API: every write on the full
    disk is acknowledged or a 507 naming the data directory, a refused one changes nothing,
    the server goes on once there is room, and after kill -9 and a restart every
    acknowledged write is there (faults.disk_full)."""
    try:
        result = faults.run_trial("diskfull", 0, random.Random(3), tmp_path)
    except faults.CannotMount as exc:
        print(f"disk-full trial skipped: {exc}")
        pytest.skip(str(exc))
    assert result["problems"] == [], result
    assert result["codes"].get(507, 0) > 0 and result["acked"] > 0, result
    assert set(result["codes"]) <= {200, 202, 507}, result


@pytest.mark.parametrize("index", [0, 1])
def test_node_agent_killed_mid_reclaim_reclaims_once(tmp_path: Path, index: int) -> None:
    """tessera-node killed -9 at the reclaim point (0) or at a random moment (1), started
    again: the owner is served and exactly one borrower is killed (faults_node)."""
    from tessera.bench import faults_node
    from tessera.isolation.build import ensure_built

    native = ensure_built()
    result = faults_node.run_trial(native, faults_node.gpu_uuid(native), index,
                                   random.Random(index), tmp_path)
    assert result["problems"] == [], result

"""The local runner: exit codes from the shim, process groups, SIGTERM then SIGKILL."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tessera.local.gpus import parse_simulate, short_model
from tessera.local.runner import Runner


def _wait(runner: Runner, proc, timeout: float = 10):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runner.reap_kills()
        ended = runner.check(proc.pid, proc.start_ticks, proc.exit_file)
        if ended is not None:
            return ended
        time.sleep(0.02)
    raise AssertionError("still running")


def test_exit_code_and_log(tmp_path: Path) -> None:
    r = Runner(tmp_path)
    p = r.start("k", [sys.executable, "-c", "print('out'); import sys; sys.exit(5)"],
                dict(os.environ), None)
    ended = _wait(r, p)
    assert ended.code == 5 and "code 5" in ended.reason
    assert "out" in Path(p.log).read_text()


def test_term_then_kill_after_grace(tmp_path: Path) -> None:
    r = Runner(tmp_path)
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)")
    p = r.start("stubborn", [sys.executable, "-c", code], dict(os.environ), None)
    while "ready" not in Path(p.log).read_text():
        time.sleep(0.02)
    started = time.monotonic()
    r.terminate(p.pid, grace=0.5)
    time.sleep(0.2)
    assert r.check(p.pid, p.start_ticks, p.exit_file) is None
    _wait(r, p)
    assert time.monotonic() - started >= 0.5
    assert not r.group_alive(p.pid)


def test_reattach_by_a_new_runner(tmp_path: Path) -> None:
    first = Runner(tmp_path)
    p = first.start("long", ["sleep", "30"], dict(os.environ), None)
    second = Runner(tmp_path)
    assert second.adopt(p.pid, p.start_ticks)
    assert not second.adopt(p.pid, p.start_ticks + 1)
    second.terminate(p.pid, grace=0.2)
    ended = _wait(second, p)
    assert ended.code is None or ended.code == 143


def test_simulate_specs() -> None:
    assert parse_simulate(["2xH100-80GB", "V100-16GB"]) == [
        (2, "H100-80GB", 80 * 2**30), (1, "V100-16GB", 16 * 2**30)]
    for bad in ("2xH100", "3x-16GB", "0xA100-40GB", "", "1xA100-0GB"):
        try:
            parse_simulate([bad])
        except ValueError as exc:
            assert "simulate" in str(exc)
        else:
            raise AssertionError(bad)
    assert short_model("Tesla V100-SXM2-16GB", 16 * 2**30) == "V100-16GB"
    assert short_model("NVIDIA H100 80GB HBM3", 80 * 2**30) == "H100-80GB"

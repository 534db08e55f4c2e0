"""Metrics and escape detection against the fake driver's ground truth: real processes (cuprobe)
on one simulated machine, the isolation library preloaded with the config files tessera-node
writes, an uncapped process beside them, and the agent (``tessera-node local``) as a process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tessera.isolation.build import NativeBuild
from tessera.node.containers import write_share
from tessera.testing.cluster import free_ports
from tests import waiting
from tests.isolation.conftest import CTX
from tests.node.conftest import H100_BYTES, machine_env
from tests.node.machines import INFER, TRAIN, UUIDS, GiB, Machine


def wait_until(what: str, check: Callable[[], Any], timeout: float = 20.0) -> Any:
    return waiting.wait_until(what, check, timeout)


@pytest.fixture
def machine(native: NativeBuild, tmp_path: Path) -> Iterator[Machine]:
    m = Machine(native, tmp_path)
    for share in (TRAIN, INFER):
        write_share(m.shares, share, host_paths=True)
    try:
        yield m
    finally:
        m.stop()


def one(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str,
        **labels: str) -> float:
    got = [v for lab, v in metrics.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    assert len(got) == 1, (name, labels, metrics.get(name))
    return got[0]


def test_metrics_match_the_fake_driver(machine: Machine) -> None:
    a = machine.share_process(TRAIN, sm=40)
    b = machine.share_process(INFER, sm=20)
    a.alloc(6 * GiB)
    a.alloc(4 * GiB)          # 10 GiB: 2 GiB above its 8 GiB request, on loan
    b.alloc(3 * GiB)
    assert a("alloc 7000000000")["rc"] == 2  # over its 16 GiB limit: refused by the library
    other = machine.uncapped(1)
    other.alloc(2 * GiB)      # an unshared GPU: not an escape
    machine.start_agent("warn")
    m = wait_until("metrics", lambda: (x := machine.metrics()).get(
        "tessera_container_gpu_memory_charged_bytes") and x)
    g0, g1 = {"gpu_uuid": UUIDS[0]}, {"gpu_uuid": UUIDS[1]}
    assert one(m, "tessera_node_ready", node="box") == 1
    assert one(m, "tessera_gpu_memory_total_bytes", model="H100-80GB", **g0) == H100_BYTES
    # NVML counts each process's context (CTX: the fake's default equals the library's)
    assert one(m, "tessera_gpu_memory_used_bytes", gpu="1", **g1) == 2 * GiB + CTX  # NVML index (DCGM's label)
    assert one(m, "tessera_gpu_memory_used_bytes", **g0) == 13 * GiB + 2 * CTX
    assert one(m, "tessera_gpu_memory_used_bytes", **g1) == 2 * GiB + CTX
    assert one(m, "tessera_gpu_memory_requested_bytes", **g0) == 12 * GiB
    assert one(m, "tessera_gpu_memory_requested_bytes", **g1) == 0
    assert one(m, "tessera_gpu_utilization_ratio", **g0) == pytest.approx(0.6)
    train = {"namespace": "team-a", "pod": "train-a", "container": "main", "workload": "train-a",
             "project": "team-a", **g0}
    # the library also charges each process's CUDA context (its per-model default, CTX)
    assert one(m, "tessera_container_gpu_memory_charged_bytes", **train) == 10 * GiB + CTX
    assert one(m, "tessera_container_gpu_memory_used_bytes", **train) == 10 * GiB + CTX  # NVML: its allocations and its context
    assert one(m, "tessera_container_gpu_memory_request_bytes", **train) == 8 * GiB
    assert one(m, "tessera_container_gpu_memory_limit_bytes", **train) == 16 * GiB
    assert one(m, "tessera_container_gpu_memory_loaned_bytes", **train) == 2 * GiB + CTX
    assert one(m, "tessera_container_gpu_sm_utilization_ratio", **train) == pytest.approx(0.4)
    assert one(m, "tessera_container_gpu_loans_reclaimed_total", **train) == 0
    infer = {"pod": "infer-b", **g0}
    assert one(m, "tessera_container_gpu_memory_charged_bytes", **infer) == 3 * GiB + CTX
    assert one(m, "tessera_container_gpu_memory_loaned_bytes", **infer) == 0
    assert one(m, "tessera_node_gpu_escaped_processes", node="box") == 0
    assert "tessera_node_gpu_escapes_total" not in m  # no escape yet: no series
    assert m["process_resident_memory_bytes"][0][1] > 0
    # A process frees memory: the next scrapes follow.
    b("free " + hex(b.alloc(GiB // 2)))  # what is left of its 4 GiB limit beside its context
    wait_until("the free seen", lambda: one(machine.metrics(),
               "tessera_container_gpu_memory_charged_bytes", **infer) == 3 * GiB + CTX)


def test_escapes_are_flagged_and_killed(machine: Machine) -> None:
    a = machine.share_process(TRAIN, sm=10)
    a.alloc(2 * GiB)
    rogue = machine.uncapped(0)   # on the shared GPU, outside any share
    rogue.alloc(5 * GiB)
    bystander = machine.uncapped(1)
    bystander.alloc(1 * GiB)
    machine.start_agent("kill")
    wait_until("the rogue killed", lambda: rogue.proc.poll() is not None)
    assert rogue.proc.returncode == -9
    m = wait_until("escape counted", lambda: (x := machine.metrics()).get(
        "tessera_node_gpu_escapes_total") and x)
    assert one(m, "tessera_node_gpu_escapes_total", gpu_uuid=UUIDS[0], kind="no-share") == 1
    assert one(m, "tessera_node_gpu_escapes_killed_total", node="box") == 1
    ev = [e for e in machine.events() if e["reason"] == "GPUUnsharedProcess"]
    assert len(ev) == 1 and f"process {rogue.proc.pid} uses {5 * GiB + CTX} bytes" in ev[0]["message"]
    assert "killed (--on-escape kill)" in ev[0]["message"]
    # Memory allocated behind the library's back by a share's own process: over its charge.
    assert a("unhooked " + str(1 * GiB))["rc"] == 0
    wait_until("a killed", lambda: a.proc.poll() is not None)
    ev = [e for e in machine.events() if e["reason"] == "GPUIsolationEscape"]
    assert len(ev) == 1 and ev[0]["pod"] == "train-a"
    assert f"more than the {2 * GiB + CTX} bytes the isolation library charged" in ev[0]["message"]
    # Never a process within its share, never one on a GPU without shares.
    assert bystander.proc.poll() is None


def test_warn_only_flags(machine: Machine) -> None:
    rogue = machine.uncapped(0)
    rogue.alloc(1 * GiB)
    machine.share_process(TRAIN, sm=0).alloc(1 * GiB)
    machine.start_agent("warn")
    m = wait_until("escape counted", lambda: (x := machine.metrics()).get(
        "tessera_node_gpu_escapes_total") and x)
    assert one(m, "tessera_node_gpu_escaped_processes", node="box") == 1
    assert rogue.proc.poll() is None, "warn does not kill"


@pytest.mark.parametrize("command", ["local", "run"])
def test_on_escape_other_than_warn_or_kill_is_refused_naming_the_flag(command: str,
                                                                       tmp_path: Path) -> None:
    args = ["--shares-dir", str(tmp_path)] if command == "local" else ["--node-name", "n"]
    r = subprocess.run([sys.executable, "-m", "tessera.node", command, *args,
                        "--on-escape", "stop"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == "tessera-node: --on-escape: must be warn or kill (got 'stop')"


def test_no_nvml_one_line_not_ready_metrics_still_served(native: NativeBuild, tmp_path: Path) -> None:
    env = machine_env(native, None)
    env["LD_LIBRARY_PATH"] = "/nonexistent"
    (port,) = free_ports(1)
    proc = subprocess.Popen([sys.executable, "-m", "tessera.node", "local",
                             f"--shares-dir={tmp_path}", f"--metrics-port={port}",
                             "--node-name=box"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        def scrape() -> str | None:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except httpx.HTTPError:
                return None
        body = wait_until("metrics served", scrape)
        assert 'tessera_node_ready{node="box"} 0.0' in body
        assert proc.poll() is None, "no crash loop"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    nvml_lines = [x for x in out.splitlines() if "NVML" in x]
    assert len(nvml_lines) == 1 and "not ready for GPU shares" in nvml_lines[0], out

"""Compute share through a real embedded server started with --gpu-compute-mode fair: the CLI
flags, the REST fields, describe, the arbiter the runner writes, and /metrics."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.isolation import arbiter
from tessera.testing.embedded import EmbeddedServer, submit_body


@pytest.fixture(scope="module")
def fair_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    mp = pytest.MonkeyPatch()
    mp.setenv("TESSERA_GPU_COMPUTE_MODE", "fair")
    s = EmbeddedServer(tmp_path_factory.mktemp("compute"), simulate=["1xH100-80GB"])
    s.start()
    try:
        yield s
    finally:
        s.cleanup()
        mp.undo()


def test_cli_flags_reach_the_arbiter_and_describe(fair_server: EmbeddedServer) -> None:
    s = fair_server
    s.cli("project", "create", "p", "--gpu", "1")
    s.cli("submit", "w1", "-p", "p", "-g", "0.5", "--gpu-compute-request", "0.3", "--gpu-compute-limit", "0.8",
          "--", "sleep", "600")
    w = s.cli_json("describe", "w1", "-p", "p", "-o", "json")
    assert w["computeShare"]["gpuComputeRequest"] == "0.3" and w["computeShare"]["gpuComputeLimit"] == "0.8"
    end = time.monotonic() + 30
    shares: list[Path] = []
    while time.monotonic() < end and not shares:
        shares = list((Path(s.data) / "compute").glob("*.share"))
        time.sleep(0.2)
    if not shares:  # the library is not built here: the share does not run uncapped either
        pytest.fail("the runner wrote no compute arbiter for a running share")
    used = {u.key: u for u in arbiter.usage(shares[0])}
    assert [(round(u.request, 3), round(u.limit, 3)) for u in used.values()] == [(0.3, 0.8)]
    text = s.cli("describe", "w1", "-p", "p").stdout
    assert "Compute:     request 0.3, limit 0.8 (fair)" in text
    assert "w1 (" in s.cli("top").stdout and "GPU time 0%" in s.cli("top").stdout
    with s.http() as c:
        metrics = c.get("/metrics").text
    assert "tessera_workload_gpu_time_seconds_total" in metrics
    assert 'tessera_workload_gpu_compute_request{gpu="' in metrics


def test_bad_flags_are_refused_naming_the_flag(fair_server: EmbeddedServer) -> None:
    s = fair_server
    r = s.cli("submit", "bad", "-p", "p", "-g", "0.5", "--gpu-compute-request", "1.5", "--", "true", check=False)
    assert r.returncode != 0 and "--gpu-compute-request: must be a number in [0, 1]" in r.stderr
    r = s.cli("submit", "bad", "-p", "p", "-g", "1", "--gpu-compute-request", "0.5", "--", "true", check=False)
    assert r.returncode != 0 and "--gpu-compute-request" in r.stderr and "whole GPUs" in r.stderr
    with s.http() as c:
        r = c.post("/api/v1/workloads/trainings", json=submit_body("bad", "p", gpuPortionRequest=0.5,
                                                                   gpuComputeRequest=0.6, gpuComputeLimit=0.4))
    assert r.status_code == 422 and r.json()["message"].startswith("spec.compute.gpuComputeLimit")


def test_memory_shares_wait_for_gpu_time_and_say_why(fair_server: EmbeddedServer) -> None:
    """Two memory shares promised 0.6 of the one GPU's time each: the memory fits both, the time
    does not, so the second waits, saying so (placement keeps the requests on a GPU within 1)."""
    s = fair_server
    s.cli("project", "create", "mem", "--gpu", "1")
    for name in ("m1", "m2"):
        s.cli("submit", name, "-p", "mem", "--gpu-memory", "4G", "--gpu-compute-request", "0.6",
              "--", "sleep", "600")
    with s.http() as c:
        listed = {w["name"]: w for w in c.get("/api/v1/workloads").json()["workloads"]
                  if w["name"] in ("m1", "m2")}
        first = s.wait_phase(c, "trainings", listed["m1"]["workloadId"], "Running", timeout=30)
        assert first["phase"] == "Running"
        deadline = time.monotonic() + 15
        while True:
            w = c.get(f"/api/v1/workloads/trainings/{listed['m2']['workloadId']}").json()
            if "waiting for GPU time" in (w.get("phaseMessage") or ""):
                break
            assert time.monotonic() < deadline, w
            time.sleep(0.1)
    assert w["phase"] == "Pending"
    assert "none has 0.6 of its time unpromised" in w["phaseMessage"]
    s.cli("delete", "m1", "-p", "mem")
    with s.http() as c:
        s.wait_phase(c, "trainings", listed["m2"]["workloadId"], "Running", timeout=30)


def test_a_project_limit_counts_the_compute_request(fair_server: EmbeddedServer) -> None:
    """Quota counts max(memory portion, compute request): 4 GB of an 80 GB GPU promised 0.7 of
    its time counts as 0.7 GPU, over a 0.5 GPU project limit, refused when submitted."""
    s = fair_server
    s.cli("project", "create", "capped", "--gpu", "0", "--limit", "0.5")
    r = s.cli("submit", "big-time", "-p", "capped", "--gpu-memory", "4G", "--gpu-compute-request", "0.7",
              "--", "sleep", "600", check=False)
    assert r.returncode != 0 and "more than project capped's limit of 0.5" in r.stderr, r.stderr
    s.cli("submit", "small-time", "-p", "capped", "--gpu-memory", "4G", "--gpu-compute-request", "0.4",
          "--", "sleep", "600")

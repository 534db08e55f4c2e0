"""GPU-hours *used* (docs/accounting.md): the meter integrating the node agents' utilisation and
the compute arbiters' GPU time into the ledger, reconciled with the allocation intervals; and a
real embedded server on the fake driver's NVML where a whole-GPU workload busy half the time
(and a half-GPU share busy a quarter of the GPU) reports about half of what it was allocated,
through REST, the CLI and /metrics."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.api.tenancy.ledger import Ledger
from tessera.api.tenancy.metering import Meter, Reading
from tests.console.fakegpu import FakeGpuServer
from tests.waiting import wait_until

T0 = 1_790_000_000.0 - 1_790_000_000.0 % 3600 + 1800  # half past an hour


def _used(ledger: Ledger, since: float, until: float, by: str = "workload") -> dict[str, float | None]:
    return {r[by]: r["gpu_hours_used"] for r in ledger.report(since, until, by, now=until)}


def test_utilisation_integrates_over_readings_and_hours(tmp_path: Path) -> None:
    """1 GPU held for 2 h, readings every 10 s at 50%: 1.00 GPU-hour used against 2.00
    allocated, across hour boundaries; a range cuts it in proportion; a 0.5 GPU share at 25%
    of the GPU is half its allocation too."""
    ledger = Ledger(tmp_path / "l.db")
    ledger.observe(T0, {"w1": ("train", "p", "user:a", 1.0), "w2": ("half", "p", "user:b", 0.5)})
    meter = Meter(ledger, lambda: Reading(0, False), interval=10)
    for i in range(0, 721):
        meter.tick(Reading(T0 + 10 * i, True, {("p", "train"): 0.5, ("p", "half"): 0.25}))
    ledger.observe(T0 + 7200, {})
    rows = {r["workload"]: r for r in ledger.report(T0 - 60, T0 + 7300, "workload", now=T0 + 7300)}
    assert rows["w1"]["gpu_hours_allocated"] == pytest.approx(2.0)
    assert rows["w1"]["gpu_hours_used"] == pytest.approx(1.0, rel=1e-9)
    assert rows["w2"]["gpu_hours_allocated"] == pytest.approx(1.0)
    assert rows["w2"]["gpu_hours_used"] == pytest.approx(0.5, rel=1e-9)
    # the middle hour exactly (rows are kept per hour: a whole hour is exact)
    mid = _used(ledger, T0 + 1800, T0 + 5400)
    assert mid["w1"] == pytest.approx(0.5, rel=1e-9)
    # by user and project add up
    assert _used(ledger, T0, T0 + 7200, "user") == pytest.approx({"user:a": 1.0, "user:b": 0.5})
    assert _used(ledger, T0, T0 + 7200, "project") == pytest.approx({"p": 1.5})
    # after the allocation closed, readings add nothing (only allocated time is metered)
    meter.tick(Reading(T0 + 7210, True, {("p", "train"): 1.0}))
    assert _used(ledger, T0, T0 + 8000)["w1"] == pytest.approx(1.0, rel=1e-9)


def test_unknown_usage_is_not_invented_and_gaps_are_capped(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db")
    ledger.observe(T0, {"w": ("w", "p", "", 1.0)})
    meter = Meter(ledger, lambda: Reading(0, False), interval=10)
    for i in range(10):  # simulated GPUs / no agent answered: nothing measured
        meter.tick(Reading(T0 + 10 * i, False))
    assert _used(ledger, T0, T0 + 100) == {"w": None}
    meter.tick(Reading(T0 + 100, True, {("p", "w"): 1.0}))
    meter.tick(Reading(T0 + 110, True, {}))  # measured idle: 0, not null
    assert _used(ledger, T0, T0 + 200) == {"w": 0.0}
    meter.tick(Reading(T0 + 1110, True, {("p", "w"): 1.0}))  # the server was down 1000 s
    assert _used(ledger, T0, T0 + 2000)["w"] == pytest.approx(30 / 3600, abs=1e-6)


def test_arbiter_gpu_time_is_used_exactly_where_present(tmp_path: Path) -> None:
    """The compute arbiter's counter wins over NVML for its workload: its increase, each GPU's
    at most the time elapsed; a counter that restarts counts from zero."""
    ledger = Ledger(tmp_path / "l.db")
    ledger.observe(T0, {"w": ("w", "p", "", 0.5), "v": ("v", "p", "", 1.0)})
    meter = Meter(ledger, lambda: Reading(0, False), interval=10)
    meter.tick(Reading(T0, True, {}, {("g0", "w"): 100.0}))
    meter.tick(Reading(T0 + 10, True, {("p", "w"): 0.9, ("p", "v"): 0.5}, {("g0", "w"): 103.0}))
    meter.tick(Reading(T0 + 20, True, {("p", "v"): 0.5}, {("g0", "w"): 2.0}))  # restarted
    meter.tick(Reading(T0 + 30, True, {("p", "v"): 0.5}, {("g0", "w"): 50.0}))  # > 10 s: capped
    used = _used(ledger, T0, T0 + 40)
    assert used["w"] == pytest.approx((3 + 2 + 10) / 3600, abs=1e-6)
    assert used["v"] == pytest.approx(15 / 3600, abs=1e-6)


def test_a_bad_metering_interval_is_refused_naming_the_setting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tessera.api.tenancy.metering import interval_from_env

    for bad in ("abc", "0", "-5", "nan", "1e9"):
        monkeypatch.setenv("TESSERA_METERING_INTERVAL", bad)
        with pytest.raises(SystemExit, match="TESSERA_METERING_INTERVAL: must be a number"):
            interval_from_env()
    monkeypatch.setenv("TESSERA_METERING_INTERVAL", "2.5")
    assert interval_from_env() == 2.5


class MeteredServer(FakeGpuServer):
    @property
    def env(self) -> dict[str, str]:
        return {**super().env, "TESSERA_METERING_INTERVAL": "0.5"}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MeteredServer]:
    s = MeteredServer(tmp_path_factory.mktemp("used"))
    with s.serving("acct", gpu="2"):
        yield s


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def test_a_workload_busy_half_the_time_uses_half_its_allocation(srv: MeteredServer) -> None:
    srv.submit_gpu("busy", "acct", 50, 2**30, "-g", "1")
    srv.submit_gpu("share", "acct", 25, 2**30, "-g", "0.5")
    span = ["--from", _iso(time.time() - 600), "--to", _iso(time.time() + 600)]

    def rows() -> dict[str, dict]:
        out = json.loads(srv.cli("report", "usage", *span, "--by", "workload", "-o", "json").stdout)
        return {r["name"]: r for r in out}

    wait_until("both measured", lambda: all((rows().get(n) or {}).get("gpu_hours_used")
                                            for n in ("busy", "share")), timeout=60)
    time.sleep(12)
    for name in ("busy", "share"):
        srv.cli("suspend", name, "-p", "acct")
    wait_until("both stopped", lambda: all(
        srv.cli_json("describe", n, "-p", "acct", "-o", "json")["phase"] == "Stopped"
        for n in ("busy", "share")), timeout=60)
    time.sleep(1.5)  # the meter's last reading of them
    got = rows()
    for name in ("busy", "share"):
        r = got[name]
        ratio = r["gpu_hours_used"] / r["gpu_hours_allocated"]
        # the start (process up, first NVML reading, first two meter readings) is allocated but
        # not yet measured busy: a little under a half
        assert 0.38 < ratio < 0.52, (name, r)
    [project] = [r for r in json.loads(srv.cli("report", "usage", *span, "-o", "json").stdout)
                 if r["project"] == "acct"]
    assert project["gpu_hours_used"] == pytest.approx(
        got["busy"]["gpu_hours_used"] + got["share"]["gpu_hours_used"], abs=2e-6)
    with srv.http() as c:
        metrics = c.get("/metrics").text
        body = c.get("/api/v1/reports/usage", params={"from": _iso(time.time() - 600),
                                                      "to": _iso(time.time() + 600)}).json()
    assert 'tessera_gpu_hours_used_total{department="",project="acct"}' in metrics
    assert body["rows"][0]["gpu_hours_used"] == pytest.approx(project["gpu_hours_used"], abs=1e-5)


class ArbiterServer(FakeGpuServer):
    """Compute share on (``--gpu-compute-mode fair``) and the fake driver's timing model, so
    a workload's kernels take GPU time and its compute arbiter charges it."""

    @property
    def env(self) -> dict[str, str]:
        (self.root / "sim").mkdir(parents=True, exist_ok=True)
        return {**super().env, "TESSERA_GPU_COMPUTE_MODE": "fair", "FAKE_CUDA_KERNEL_TIME": "grid",
                "FAKE_GPU_SIM_DIR": str(self.root / "sim"), "TESSERA_METERING_INTERVAL": "0.5"}


def test_gpu_time_the_arbiter_charged_is_what_is_used(tmp_path: Path) -> None:
    """cuspin on a 0.5 share, launching kernels half of each second (``--onoff 500``): the
    compute arbiter charges it about 0.5 GPU-seconds a second, and GPU-hours used is that
    charge (NVML says 0% for it here, so the arbiter's counter is what was metered)."""
    s = ArbiterServer(tmp_path)
    with s.serving("acct", gpu="2"):
        spin = str(s.native.program("cuspin"))
        s.cli("submit", "spin", "-p", "acct", "-g", "0.5", "--gpu-compute-request", "0.5",
              "--gpu-compute-limit", "1", "--", spin, "--us", "1000", "--inflight", "8",
              "--seconds", "600", "--onoff", "500")

        def charged() -> float:
            gpus = s.cli_json("describe", "spin", "-p", "acct", "-o", "json")["computeShare"]["gpus"]
            return float(sum(g["gpuSecondsTotal"] for g in gpus))

        wait_until("GPU time charged", lambda: charged() > 1.0, timeout=60)
        before, t_before = charged(), time.time()
        time.sleep(10)
        s.cli("suspend", "spin", "-p", "acct")
        after, t_after = charged(), time.time()
        wait_until("stopped", lambda: s.cli_json("describe", "spin", "-p", "acct", "-o", "json")
                   ["phase"] == "Stopped", timeout=60)
        time.sleep(1.5)
        span = ["--from", _iso(time.time() - 600), "--to", _iso(time.time() + 600)]
        [row] = json.loads(s.cli("report", "usage", *span, "--by", "workload", "-o",
                                 "json").stdout)
    used = row["gpu_hours_used"] * 3600
    # busy half the time: about half a GPU-second per second while measured
    assert 0.4 < (after - before) / (t_after - t_before) < 0.6, (before, after)
    # what was metered is the arbiter's charge (less what it charged before the meter's first
    # reading of its counter, a second or so)
    assert after - 2.0 < used <= after + 0.1, (used, after)

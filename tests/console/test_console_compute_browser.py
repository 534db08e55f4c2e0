"""The console shows compute shares (docs/compute-share.md), in Debian's Chromium: a server with
compute shares on (fair), a workload whose process really launches kernels (cuspin, under the
isolation library, on the fake driver's timing model) with request 0.3 and limit 0.5; the
workload page says its request, limit and measured GPU time, and the GPUs page says it in the
share's details and sums it per GPU. The time shown is what the arbiter charged, never above the
limit it enforces."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.isolation.build import ensure_built
from tessera.testing.embedded import EmbeddedServer
from tests.console.browsing import By, go, login, shoot, until


@pytest.fixture(scope="module")
def fair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    mp = pytest.MonkeyPatch()
    mp.setenv("TESSERA_GPU_COMPUTE_MODE", "fair")
    s = EmbeddedServer(tmp_path_factory.mktemp("compute-console"), simulate=["1xH100-80GB"])
    s.start()
    try:
        yield s
    finally:
        s.cleanup()
        mp.undo()


def percent(text: str, label: str) -> int:
    found = re.search(label + r" (\d+)%", text)
    assert found, f"no '{label} N%' in {text!r}"
    return int(found.group(1))


def test_workload_and_gpus_pages_show_compute_request_limit_and_gpu_time(
        browser, fair: EmbeddedServer, artifacts: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    native = ensure_built()
    fair.cli("project", "create", "p", "--gpu", "1")
    with fair.http() as c:
        uuid = c.get("/api/v1/cluster").json()["nodes"][0]["gpus"][0]["uuid"]
    # The simulated GPU is the fake driver's timing model for this one process.
    fair.cli("submit", "spin", "-p", "p", "--gpu-memory", "4G", "--gpu-compute-request", "0.3",
             "--gpu-compute-limit", "0.5", "-e", f"LD_LIBRARY_PATH={native.fake_dir}",
             "-e", "FAKE_CUDA_KERNEL_TIME=grid", "-e", f"FAKE_GPU_UUIDS={uuid}",
             "-e", f"FAKE_GPU_SIM_DIR={tmp_path}", "--",
             str(native.program("cuspin")), "--us", "1000", "--inflight", "8", "--seconds", "300")
    wid = fair.cli_json("describe", "spin", "-p", "p")["workloadId"]
    login(browser, fair)
    go(browser, fair, f"workload/trainings/{wid}")
    text = until("the measured GPU time", lambda: (t := browser.find_element(By.ID, "w-compute").text)
                 and percent(t, "GPU time") > 0 and t, timeout=60)
    assert text.startswith("request 0.3, limit 0.5 (fair); GPU time ")
    assert percent(text, "GPU time") <= 55, text  # held to its limit, 0.5
    shoot(browser, artifacts, "compute-workload")

    go(browser, fair, "gpus")
    seg = until("the share", lambda: browser.find_element(By.CSS_SELECTOR, '.seg.share[data-workload="spin"]'))
    details = seg.get_attribute("title") or ""
    assert "compute request 0.3, limit 0.5, GPU time" in details, details
    line = until("the GPU's time line", lambda: browser.find_element(By.CSS_SELECTOR, ".gpu .gputime")).text
    assert line.endswith("30% promised"), line
    assert 0 < percent(line, "GPU time") <= 55, line
    shoot(browser, artifacts, "compute-gpus")

"""Time-based fair share in embedded mode, end to end (docs/scheduling.md): the real server
started with ``--fair-share-history``; project a uses both GPUs for a few seconds, then b asks
for both. History gives b more than its weight's half: b's fair share is 2 GPUs, "of which 1
from usage history", shown by the API and by ``tessera project describe``, and the cycle acts on
it (b's workloads run, a's are reclaimed). Bad settings are refused naming the flag and the rule
before anything starts."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By

from tessera.core.usage import decayed_usage
from tessera.core.usage_saved import restore
from tessera.testing.embedded import EmbeddedServer, submit_body
from tests.console.browsing import go, login, until
from tests.waiting import wait_until

HISTORY = ["--fair-share-history", "window=1h,half-life=30s,k=2,save-every=1s"]


class HistoryServer(EmbeddedServer):
    def server_argv(self, simulate: Sequence[str] | None) -> list[str]:
        return [*super().server_argv(simulate), *HISTORY]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    s = HistoryServer(Path(tmp_path_factory.mktemp("history")), simulate=["2xV100-16GB"])
    with s.serving("a", "b", gpu="0"):
        yield s


def _project(server: EmbeddedServer, name: str) -> dict[str, Any]:
    with server.http() as c:
        return dict(c.get(f"/api/v1/org-unit/projects/{name}").json())


def test_a_starved_project_gets_its_history_back_and_is_told(browser, server) -> None:  # type: ignore[no-untyped-def]
    ids: list[str] = []
    with server.http() as c:
        for i in range(2):
            ids.append(c.post("/api/v1/workloads/trainings", json=submit_body(
                f"a{i}", "a", gpuDevicesRequest=1)).json()["workloadId"])
        for wid in ids:
            server.wait_phase(c, "trainings", wid, "Running")
        time.sleep(3)  # a's usage history: 2 GPUs for a few seconds
        b_ids = [c.post("/api/v1/workloads/trainings", json=submit_body(
            f"b{i}", "b", gpuDevicesRequest=1)).json()["workloadId"] for i in range(2)]
        ids += b_ids
        try:
            status = wait_until("b's fair share with history", lambda: (
                s := _project(server, "b")["status"]).get("fromUsageHistory", {}).get("gpu", 0) > 0.5
                and s, timeout=20)
            # Plain fair share would split 1 / 1; a used everything, so history gives b both.
            assert status["fairShare"]["gpu"] == pytest.approx(2.0, abs=0.01), status
            assert status["fromUsageHistory"]["gpu"] == pytest.approx(1.0, abs=0.01), status
            a = _project(server, "a")["status"]
            assert a["fromUsageHistory"]["gpu"] == pytest.approx(-1.0, abs=0.01), a
            assert a["usageGpuHours"] >= 0.0
            # The cycle acts on it: a's GPUs are reclaimed and both of b's workloads start (their
            # events; later cycles may move GPUs back as b's own use catches up with a's).
            def kinds(wid: str) -> list[str]:
                return [e["kind"] for e in c.get(f"/api/v1/workloads/trainings/{wid}").json()["events"]]

            wait_until("b's workloads started", lambda: all("Started" in kinds(w) for w in b_ids), timeout=20)
            assert any("Preempted" in kinds(w) for w in ids[:2])
            # From then on b's own use counts too, so its extra share shrinks and may turn into
            # "less" once b has used more than a; either way the history is shown (polled: at the
            # crossing it is 0 for a moment).
            clause = r"(, of which [0-9.]+ from usage history|, [0-9.]+ less due to usage history)"
            for name in ("b", "a"):
                out = wait_until(f"describe {name} with its history", lambda name=name: (  # type: ignore[misc]
                    o if re.search(rf"^fair share [0-9.]+ GPU{clause}$",
                                   o := server.cli("project", "describe", name).stdout, re.M) else None),
                    timeout=20)
                assert f"project {name}" in out
            login(browser, server)
            go(browser, server, "projects")
            for name in ("b", "a"):
                shown = until(f"the console's history note for {name}", lambda name=name: (  # type: ignore[misc]
                    t if re.fullmatch(r"of which [0-9.]+ from usage history|[0-9.]+ less due to usage history",
                                      t := browser.find_element(By.CSS_SELECTOR,
                                      f'[data-project="{name}"] [data-col="from-history"]').text) else None),
                    timeout=20)
                assert shown
        finally:
            for wid in ids:
                c.delete(f"/api/v1/workloads/trainings/{wid}")


def _saved(server: EmbeddedServer) -> dict[str, Any] | None:
    """The usage history record the server last wrote (its store's meta row), read-only."""
    db = sqlite3.connect(f"file:{server.data / 'tessera.db'}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT value FROM meta WHERE key='usage_history'").fetchone()
    finally:
        db.close()
    return None if row is None else dict(json.loads(row[0]))


def _usage_at(record: dict[str, Any], project: str, at: float) -> float:
    records, _, _ = restore(record, at)
    return decayed_usage(records, at, {project: (3600.0, 30.0)}).get(project, 0.0)


def test_usage_history_survives_a_crash(server) -> None:  # type: ignore[no-untyped-def]
    """a uses both GPUs for a second and stops; the server is SIGKILLed and started again:
    the history it decides with after the restart (the record it writes) holds a's usage exactly
    as before (a server that forgot has none: this assertion failed with the restore skipped).
    A corrupt record: tests/local/test_usage_history_store.py."""
    with server.http() as c:
        ids = [c.post("/api/v1/workloads/trainings", json=submit_body(
            f"kept{i}", "a", gpuDevicesRequest=1)).json()["workloadId"] for i in range(2)]
        for wid in ids:
            server.wait_phase(c, "trainings", wid, "Running")
        time.sleep(1)
        stopped = time.time()
        for wid in ids:
            c.delete(f"/api/v1/workloads/trainings/{wid}")
    before = wait_until("a's stopped runs saved", lambda: (
        r if (r := _saved(server)) and r["savedAt"] > stopped + 0.5 and _usage_at(r, "a", stopped) > 1.5
        else None), timeout=20)
    used = _usage_at(before, "a", stopped)  # 2 GPUs x 1 s, and the first test's, decayed
    server.kill()
    restarted = time.time()
    server.start()
    after = wait_until("the record written after the restart", lambda: (
        r if (r := _saved(server)) and r["savedAt"] > restarted else None), timeout=20)
    assert _usage_at(after, "a", stopped) == pytest.approx(used, rel=1e-6)


@pytest.mark.parametrize(("flags", "says"), [
    (["--fair-share-history", "window=0"], "--fair-share-history window: must be more than 0"),
    (["--fair-share-history", "half-life=400d"], "--fair-share-history half-life: must be at most one year"),
    (["--fair-share-history", "k=1", "--fair-share-history-for", "ml:window=-2h"],
     "--fair-share-history-for ml window: must be more than 0"),
])
def test_bad_settings_are_refused_before_starting(tmp_path: Path, flags: list[str], says: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "tessera.local.server", "--data-dir", str(tmp_path),
                           "--port", "1", *flags], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert not (tmp_path / "tessera.db").exists()  # nothing half-made

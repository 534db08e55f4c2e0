"""tessera_workload_pending_seconds times the last wait, from the last transition to Pending
(submitted, requeued or resumed) until the start, not from submission: a real embedded server, a
workload run, suspended for a while, resumed; its second start is observed with the short wait
after the resume, not with its whole first run."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tessera.testing.embedded import EmbeddedServer


@pytest.fixture
def server(tmp_path) -> Iterator[EmbeddedServer]:  # type: ignore[no-untyped-def]
    s = EmbeddedServer(tmp_path, simulate=["1xV100-16GB"])
    with s.serving("team-a"):
        yield s


def _pending(server: EmbeddedServer) -> tuple[float, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    got = {s.name: s.value for f in text_string_to_metric_families(text)
           if f.name == "tessera_workload_pending_seconds" for s in f.samples
           if s.labels.get("type") == "Training" and not s.name.endswith("_bucket")}
    return got.get("tessera_workload_pending_seconds_count", 0.0), \
        got.get("tessera_workload_pending_seconds_sum", 0.0)


def test_a_resumed_workload_is_timed_from_its_resume(server: EmbeddedServer) -> None:
    _pending(server)  # the collector's watermark: workloads that start after this count
    time.sleep(1.1)
    server.cli("submit", "w", "-p", "team-a", "-g", "0.5", "--", "sleep", "600")
    server.cli("wait", "w", "-p", "team-a", "--timeout", "30")
    count, total = _pending(server)
    assert count == 1
    time.sleep(4)  # it runs a while, then is stopped
    server.cli("suspend", "w", "-p", "team-a")
    server.cli("wait", "w", "-p", "team-a", "--for", "Stopped", "--timeout", "30")
    time.sleep(2)
    server.cli("resume", "w", "-p", "team-a")
    server.cli("wait", "w", "-p", "team-a", "--timeout", "30")
    count2, total2 = _pending(server)
    assert count2 == 2
    doc = server.cli_json("describe", "w", "-p", "team-a")
    assert doc["pendingSince"] > doc["createdAt"]
    # the second wait: from the resume to the start (a second or two), not from submission (> 6 s)
    assert total2 - total < 3, (total, total2)

"""The cluster document's cache (tessera.api.cluster_cache): built once for many callers, served
stale for a while as a newer one is built in the background, built at once after a write drops
it, and never changed by a caller's redaction."""

from __future__ import annotations

import threading
import time
from typing import Any

from tessera.api.cluster_cache import ClusterCache


class Builds:
    def __init__(self, delay: float = 0.0) -> None:
        self.count = 0
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self) -> dict[str, Any]:
        time.sleep(self.delay)
        with self.lock:
            self.count += 1
            return {"nodes": [{"name": f"n{self.count}", "gpus": [{"workloads": [{"name": "w"}]}]}]}


def test_many_callers_one_build() -> None:
    builds = Builds(delay=0.2)
    cache = ClusterCache(builds, max_age=5.0, min_gpus=0)
    bodies: list[bytes] = []
    threads = [threading.Thread(target=lambda: bodies.append(cache.body(None))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert builds.count == 1 and len(set(bodies)) == 1


def test_stale_answered_at_once_while_the_next_is_built() -> None:
    builds = Builds(delay=0.3)
    cache = ClusterCache(builds, max_age=0.1, stale_for=5.0, min_gpus=0)
    first = cache.get()
    time.sleep(0.15)  # older than max_age: answered from the cache, a build starts behind it
    t0 = time.monotonic()
    again = cache.get()
    assert again is first and time.monotonic() - t0 < 0.1
    deadline = time.monotonic() + 5
    while cache.get() is first:
        assert time.monotonic() < deadline, "no background build"
        time.sleep(0.05)
    assert builds.count == 2 and b'"n2"' in cache.body(None)


def test_too_old_or_dropped_is_built_now() -> None:
    builds = Builds()
    cache = ClusterCache(builds, max_age=0.05, stale_for=0.1, min_gpus=0)
    cache.get()
    time.sleep(0.2)  # past stale_for: the caller waits for a new one
    assert b'"n2"' in cache.body(None)
    cache.invalidate()  # a write: the next caller sees its change
    assert b'"n3"' in cache.body(None)


def test_a_redacted_copy_leaves_the_cache_alone() -> None:
    cache = ClusterCache(Builds(), max_age=60, min_gpus=0)

    def hide(doc: dict[str, Any]) -> dict[str, Any]:
        doc["nodes"][0]["gpus"][0]["workloads"] = [{"name": "", "hidden": True}]
        return doc
    assert b'"hidden":true' in cache.body(hide)
    assert b'"name":"w"' in cache.body(None)


def test_a_small_cluster_is_built_on_every_request() -> None:
    """Under min_gpus GPUs (a machine, a test cluster) the document always agrees with the
    workloads' phases: a crash freeing a share shows in the next answer."""
    builds = Builds()
    cache = ClusterCache(builds, max_age=60, min_gpus=2)
    assert b'"n1"' in cache.body(None) and b'"n2"' in cache.body(None)
    assert builds.count == 2

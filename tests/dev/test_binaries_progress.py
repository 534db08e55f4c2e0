"""Go test binaries: each build is announced with its place in the queue and an estimate, and a
wait on another process's build lock says who holds it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tessera.testing import binaries


def _fake_build(binary: binaries.Binary, out: Path) -> None:
    out.write_text("#!/bin/sh\n")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TESSERA_CACHE", str(tmp_path))
    fakes = {n: binaries.Binary(n, "v0", _fake_build) for n in ("alpha", "beta")}
    monkeypatch.setattr(binaries, "BINARIES", fakes)
    return tmp_path


def test_each_build_says_its_place_in_the_queue_and_an_estimate(cache: Path) -> None:
    logs = cache / "logs"
    logs.mkdir()
    (logs / "build-times.jsonl").write_text(json.dumps({"name": "alpha", "seconds": 42.0}) + "\n")
    said: list[str] = []
    paths = binaries.ensure(["alpha", "beta"], report=said.append)
    assert paths["alpha"].is_file() and paths["beta"].is_file()
    assert any(m.startswith("building 2 Go binaries") and "alpha, beta" in m for m in said)
    assert any(m.startswith("[1/2] building alpha v0 (about 42 s;") for m in said)
    assert any(m.startswith("[2/2] building beta v0 (about 2 min;") for m in said)
    assert any(m.startswith("[2/2] built beta v0 in") for m in said)
    # Cached: nothing is announced the second time.
    said.clear()
    binaries.ensure(["alpha", "beta"], report=said.append)
    assert said == []


def test_a_wait_on_the_lock_says_who_holds_it(cache: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import time, sys; from tessera.testing import binaries\n"
         "with binaries._build_lock():\n"
         "    binaries._write_holder('kube-apiserver v1.36.3 [2/5]')\n"
         "    print('held', flush=True); time.sleep(3)\n"],
        stdout=subprocess.PIPE, text=True, env={**__import__("os").environ})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        said: list[str] = []
        t0 = time.monotonic()
        with binaries._build_lock(said.append, poll=0.1):
            pass
        assert time.monotonic() - t0 > 0.5
        assert len(said) == 1
        assert f"held by pid {holder.pid}" in said[0]
        assert "building kube-apiserver v1.36.3 [2/5]" in said[0]
    finally:
        holder.wait(10)
    assert not (cache / "build.lock.holder").exists()

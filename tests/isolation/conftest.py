"""Drives the isolation library against the fake driver in real subprocesses."""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tessera.isolation.build import NativeBuild, ensure_built

GiB = 2**30
H100 = "NVIDIA H100 80GB HBM3=81559Mi"
H100_BYTES = 81559 * 2**20
V100X4 = ";".join(["Tesla V100-SXM2-16GB=16Gi"] * 4)
# What the library charges per CUDA context when no context-overhead is configured (its
# per-architecture default, docs/isolation.md "Context memory"): Hopper 512 MiB, Volta 320 MiB.
CTX = 512 * 2**20
CTX_V100 = 320 * 2**20


@pytest.fixture(scope="session")
def native() -> NativeBuild:
    return ensure_built()


def clean_env(native: NativeBuild, *, preload: bool = True, devices: str = H100,
              extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A process environment with the fake driver, our library preloaded, and nothing of ours
    inherited from the test runner."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TESSERA_", "FAKE_", "CUDA_")) and k not in ("LD_PRELOAD",)}
    env["LD_LIBRARY_PATH"] = str(native.fake_dir)
    env["FAKE_GPU_DEVICES"] = devices
    if preload:
        # TESSERA_ISOLATION_TEST_LIBRARY: run the tests against another build of the library
        # (e.g. the one before a fix, to see a new test fail there).
        env["LD_PRELOAD"] = os.environ.get("TESSERA_ISOLATION_TEST_LIBRARY") or str(native.library)
    env.update(extra or {})
    return env


class Probe:
    """One cuprobe process: send a command, read its one-line answer as a dict."""

    def __init__(self, native: NativeBuild, env: Mapping[str, str], mode: str = "dlsym",
                 version: int | None = None) -> None:
        if mode == "linked":
            argv = [str(native.program("cuprobe_linked"))]
        else:
            argv = [str(native.program("cuprobe")), mode]
            if version is not None:
                argv.append(str(version))
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=dict(env), bufsize=1)

    def raw(self, line: str, timeout: float = 10.0) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"no answer to {line!r}")
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"probe exited on {line!r}: {self.stderr()}")
        return answer.strip()

    def send(self, line: str) -> None:
        """Sends a command without waiting for the answer (for calls that block)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def __call__(self, line: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for token in self.raw(line).split():
            key, _, value = token.partition("=")
            out[key] = int(value, 0)
        return out

    def start(self, device: int = 0) -> Probe:
        assert self("init")["rc"] == 0
        assert self(f"ctx {device}")["rc"] == 0
        return self

    def alloc(self, size: int) -> int:
        """Allocates and returns the pointer, failing the test if the allocation is refused."""
        r = self(f"alloc {size}")
        assert r["rc"] == 0, r
        return r["ptr"]

    def info(self) -> tuple[int, int]:
        r = self("info")
        assert r["rc"] == 0, r
        return r["free"], r["total"]

    def stderr(self) -> str:
        self.close()
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("exit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=5)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()

    def wait_stderr_line(self, text: str, timeout: float = 10.0) -> None:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + timeout
        seen = ""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stderr], [], [], 0.2)
            if ready:
                line = self.proc.stderr.readline()
                seen += line
                if text in line:
                    return
        raise TimeoutError(f"{text!r} not seen on stderr; got {seen!r}")


@pytest.fixture
def probes() -> Iterator[list[Probe]]:
    """Collects probes a test starts so they are always stopped."""
    started: list[Probe] = []
    yield started
    for p in started:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait()


@pytest.fixture
def probe(native: NativeBuild, probes: list[Probe]):  # type: ignore[no-untyped-def]
    def make(env: Mapping[str, str], mode: str = "dlsym", version: int | None = None) -> Probe:
        p = Probe(native, env, mode, version)
        probes.append(p)
        return p

    return make


def run(native: NativeBuild, program: str, env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(native.program(program)), *args], env=dict(env), capture_output=True,
                          text=True, timeout=30, check=False)


def region_of(tmp_path: Path) -> Path:
    return tmp_path / "region"


def fake_uuids(native: NativeBuild, devices: str = V100X4) -> list[str]:
    """The UUIDs the fake driver gives these devices, read through NVML (no library)."""
    out = run(native, "smi", clean_env(native, preload=False, devices=devices)).stdout
    return [line.split(", ")[2] for line in out.splitlines()]

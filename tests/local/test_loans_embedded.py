"""Dynamic fractions in embedded mode, end to end (issue #11 item 4): a real ``tessera up`` with
the isolation library, real workload processes allocating through the fake CUDA driver on one
simulated V100, the node-wide loans ledger and the server's reclaimer.

A borrower (request 2 GiB, limit 14 GiB) takes 11 GiB while the GPU is free; an owner (8 GiB,
within what the scheduler placed) then allocates 6 GiB: the GPU is short only because of the
borrower's loan, so the owner's allocation waits, the reclaimer kills the borrower's GPU process
(not its pod: the shell around it keeps running), the owner's allocation succeeds, and both
workloads say why in their events. A third workload within its request is never touched."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tessera.isolation.build import NativeBuild, ensure_built
from tessera.testing.embedded import EmbeddedServer
from tests.waiting import wait_until as wait_for

GiB = 2**30
V100 = "Tesla V100-SXM2-16GB=16Gi"


class FakeDriverServer(EmbeddedServer):
    """Workloads inherit the server's environment: the fake driver on the library path and one
    process state file shared by every workload (one simulated GPU)."""

    def __init__(self, root: Path, native: NativeBuild) -> None:
        super().__init__(root, simulate=["1xV100-16GB"])
        self.native = native

    @property
    def env(self) -> dict[str, str]:
        env = super().env
        env.update({"LD_LIBRARY_PATH": str(self.native.fake_dir), "FAKE_GPU_DEVICES": V100,
                    "FAKE_GPU_STATE": str(self.root / "gpu.state")})
        return env


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeDriverServer]:
    native = ensure_built()
    s = FakeDriverServer(tmp_path_factory.mktemp("loans"), native)
    with s.serving("team-a"):
        yield s


def gpu_program(srv: FakeDriverServer, allocs: Sequence[int]) -> list[str]:
    """A pod command: a shell feeding cuprobe (a CUDA program) its commands, then keeping its
    stdin open so the process holds its memory; the shell outlives a killed cuprobe."""
    lines = "".join(f"alloc {n}\\n" for n in allocs)
    probe = shlex.quote(str(srv.native.program("cuprobe")))
    return ["sh", "-c", f"(printf 'init\\nctx 0\\n{lines}'; sleep 600) | {probe} dlsym"]


def uuid_env(srv: FakeDriverServer) -> list[str]:
    uuid = srv.cli_json("top")["nodes"][0]["gpus"][0]["uuid"]
    return ["-e", f"FAKE_GPU_UUIDS={uuid}"]


def log_lines(srv: FakeDriverServer, name: str) -> list[str]:
    return srv.cli("logs", name, "-p", "team-a").stdout.splitlines()


def test_a_loan_is_taken_back_for_the_owner(srv: FakeDriverServer) -> None:
    env = uuid_env(srv)
    # The borrower is a workspace (a notebook): its GPU process may be killed, never its pod.
    srv.cli("submit", "borrower", "-p", "team-a", "--interactive", "--gpu-memory-request", "2Gi",
            "--gpu-memory-limit", "14Gi", *env, "--", *gpu_program(srv, [11 * GiB]))
    wait_for("the borrower's 11 GiB", lambda: sum(
        ln.startswith("rc=0") for ln in log_lines(srv, "borrower")) >= 3)
    srv.cli("submit", "small", "-p", "team-a", "--gpu-memory", "1Gi", *env, "--",
            *gpu_program(srv, [GiB // 2]))
    wait_for("the small workload's allocation", lambda: sum(
        ln.startswith("rc=0") for ln in log_lines(srv, "small")) >= 3)
    srv.cli("submit", "owner", "-p", "team-a", "--gpu-memory", "8Gi", *env, "--",
            *gpu_program(srv, [6 * GiB]))
    # The owner's allocation, within its request, waits for the reclaim and then succeeds.
    owner = wait_for("the owner's allocation", lambda: [
        ln for ln in log_lines(srv, "owner") if ln.startswith("rc=")][2:])
    assert owner[0].startswith("rc=0"), (owner, log_lines(srv, "owner"), log_lines(srv, "borrower"), srv.cli("describe", "borrower", "-p", "team-a").stdout)
    # Both say why; only the borrower's GPU process was killed: its pod (the shell) runs on.
    described = srv.cli("describe", "borrower", "-p", "team-a").stdout
    assert "GPUMemoryLoanReclaimed" in described
    assert "reclaimed for owner on GPU-" in described and "of borrower" in described
    pid = int(re.search(r"process (\d+) of borrower", described).group(1))  # type: ignore[union-attr]
    assert not _running(pid)
    borrower = srv.cli_json("describe", "borrower", "-p", "team-a")
    assert (borrower["type"], borrower["phase"]) == ("Workspace", "Running")
    assert "GPUMemoryLoanReturned" in srv.cli("describe", "owner", "-p", "team-a").stdout
    small = srv.cli("describe", "small", "-p", "team-a").stdout
    assert "GPUMemoryLoan" not in small and "Running" in small
    srv.cli("delete", "borrower", "owner", "small", "-p", "team-a")


def test_every_share_config_joins_the_ledger(srv: FakeDriverServer) -> None:
    srv.cli("submit", "plain", "-p", "team-a", "-g", "0.25", "--", "sleep", "60")
    srv.cli("wait", "plain", "-p", "team-a", "--timeout", "20")
    env = srv.cli_json("describe", "plain", "-p", "team-a")["pods"][0]["env"]
    config = Path(env["TESSERA_GPU_CONFIG"]).read_text()
    loans = next(ln for ln in config.splitlines() if ln.startswith("loans "))
    assert f"dir={srv.data / 'loans'}" in loans and "priority=50" in loans
    assert "headroom=335544320" in loans  # the V100's 320 MiB, charged per context too
    assert "context-overhead 335544320" in config
    srv.cli("delete", "plain", "-p", "team-a")


def _running(pid: int) -> bool:
    """Alive and not a zombie (the killed process's parent shell reaps it only later)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")

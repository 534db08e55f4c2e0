"""Workloads on one fake L4 with the loans ledger: their isolation files and probes (the loans
tests share them)."""

from __future__ import annotations

from pathlib import Path

from tessera.isolation import DeviceShare
from tessera.isolation.build import NativeBuild
from tessera.isolation.config import LoansConfig, write_workload_files
from tests.isolation.conftest import GiB, Probe, clean_env

GPU = "NVIDIA L4=24Gi"


CTX = 256 * 2**20  # context-overhead written in each workload's file (charged like an allocation)


def workload(native: NativeBuild, tmp: Path, name: str, uuid: str, request: int, limit: int,
             priority: int = 0, wait_ms: int = 10_000) -> dict[str, str]:
    loans = LoansConfig(tmp / "loans", share=name, priority=priority, wait_ms=wait_ms,
                        headroom_bytes=HEADROOM)
    files = write_workload_files(tmp / name, [DeviceShare(0, uuid, limit, request)], loans=loans,
                                 context_overhead_bytes=CTX)
    # One GPU for every process (FAKE_GPU_STATE): the driver's free memory is the node's, as on a
    # real GPU (the library asks it before holding a within-request allocation back).
    return clean_env(native, devices=GPU, extra={"TESSERA_GPU_CONFIG": str(files.config_path),
                                                 "FAKE_GPU_STATE": str(tmp / "gpu.state")})


def started(probe, env) -> Probe:  # type: ignore[no-untyped-def]
    return probe(env).start()


HEADROOM = 1 * GiB

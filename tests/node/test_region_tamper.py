"""Issue #28 class 7: a program that writes its workload's region file (the accounting every
process of the workload shares) changes its own limit; no user-space library can stop that (the
program runs with the same rights as the library in the same address space; docs/isolation.md
"What cannot be closed from user space"). What catches it is the node agent's ``over-limit``
escape: NVML's per-process memory of the share's processes against the share's limit, both the
agent's own figures, nothing the tenant writes. Real processes on the fake driver, the region and
config tessera-node writes, NVML's figures as tessera-node reads them."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tessera.isolation.build import NativeBuild
from tessera.node.containers import Share, ShareDevice, config_dir, region_path, write_share
from tessera.node.escapes import OVER_CHARGE, OVER_LIMIT, candidates
from tessera.node.nvml import GpuUsage, ProcessUsage
from tessera.node.usage import snapshot
from tests.node.conftest import H100, machine_env, node_json

GiB = 2**30
UUID = "GPU-0000aaaa-1111-2222-3333-555555555555"
POD_UID = "0a1b2c3d-1111-2222-3333-777788889999"


def test_a_program_writing_its_region_is_caught_over_its_limit(native: NativeBuild, tmp_path: Path) -> None:
    share = Share(key="d" * 16, namespace="team-a", pod="tamper", uid=POD_UID, containers=("main",),
                  devices=(ShareDevice(UUID, 2 * GiB, 2 * GiB),))
    shares = tmp_path / "shares"
    write_share(shares, share, host_paths=True)
    env = machine_env(native, tmp_path / "gpu.state", devices=H100,
                      extra={"FAKE_GPU_UUIDS": UUID, "CUDA_VISIBLE_DEVICES": UUID,
                             "LD_PRELOAD": str(native.library),
                             "TESSERA_GPU_CONFIG": str(config_dir(shares, share.key, "main") / "gpu-isolation.conf")})
    region = region_path(shares, share.key)
    proc = subprocess.Popen([str(native.program("adversary4")), "region-write", str(region)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        held = int(line.split()[0].split("=")[1])
        assert held > 3 * GiB, line  # the library alone cannot stop it (documented)

        def read(path: str) -> str:
            if path.endswith("/cgroup") and int(path.split("/")[2]) == proc.pid:
                return f"0::/kubepods/burstable/pod{POD_UID}/abc\n"
            return Path(path).read_text()

        gpus = [GpuUsage(g["uuid"], g["index"], g["memory_total"], g["memory_used"], g["utilization"],
                         tuple(ProcessUsage(p["pid"], p["used_bytes"], p["sm_util"]) for p in g["processes"]))
                for g in node_json({k: v for k, v in env.items() if k not in ("LD_PRELOAD", "TESSERA_GPU_CONFIG")},
                                   "usage")]
        usage = snapshot(gpus, {}, [share], lambda s: region_path(shares, s.key), read=read)
        found = candidates(usage)
        kinds = {(e.pid, e.kind) for e in found}
        assert (proc.pid, OVER_LIMIT) in kinds, found
        assert (proc.pid, OVER_CHARGE) not in kinds  # its slot still says what it holds: only the limit check sees it
        assert "more than its limit of 2147483648 bytes" in next(e for e in found if e.kind == OVER_LIMIT).message("x")
    finally:
        proc.communicate("", timeout=30)

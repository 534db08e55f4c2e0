"""A share's process in which the isolation library did not load (an old-glibc or musl image,
LD_PRELOAD taken away) is detected and reported, not taken for an isolated one: real processes
on the fake driver, the real region tessera-node writes, NVML's real figures; only the pod's
cgroup (which maps a host pid to the pod) is given, as /proc/PID/cgroup would on a node."""

from __future__ import annotations

from pathlib import Path

from tessera.isolation.build import NativeBuild
from tessera.node.containers import Share, ShareDevice, config_dir, region_path, write_share
from tessera.node.escapes import NO_PRELOAD, candidates
from tessera.node.nvml import GpuUsage, ProcessUsage
from tessera.node.usage import snapshot
from tests.isolation.conftest import Probe
from tests.node.conftest import H100, machine_env, node_json

GiB = 2**30
UUID = "GPU-0000aaaa-1111-2222-3333-444444444444"
POD_UID = "0a1b2c3d-1111-2222-3333-444455556666"


def test_a_share_process_without_the_library_is_reported(native: NativeBuild,
                                                          tmp_path: Path) -> None:
    share = Share(key="c" * 16, namespace="team-a", pod="old-image", uid=POD_UID,
                  containers=("main",), devices=(ShareDevice(UUID, 4 * GiB, 4 * GiB),))
    shares = tmp_path / "shares"
    write_share(shares, share, host_paths=True)
    env = machine_env(native, tmp_path / "gpu.state", devices=H100,
                      extra={"FAKE_GPU_UUIDS": UUID, "CUDA_VISIBLE_DEVICES": UUID})
    conf = config_dir(shares, share.key, "main") / "gpu-isolation.conf"
    isolated = Probe(native, {**env, "LD_PRELOAD": str(native.library),
                              "TESSERA_GPU_CONFIG": str(conf)}).start(0)
    bare = Probe(native, env).start(0)  # same pod, no library
    try:
        isolated.alloc(GiB)
        bare.alloc(2 * GiB)
        pods = {isolated.proc.pid, bare.proc.pid}

        def read(path: str) -> str:
            pid = int(path.split("/")[2])
            if path.endswith("/cgroup") and pid in pods:
                return f"0::/kubepods/burstable/pod{POD_UID}/abc\n"
            return Path(path).read_text()

        gpus = [GpuUsage(g["uuid"], g["index"], g["memory_total"], g["memory_used"],
                         g["utilization"], tuple(ProcessUsage(p["pid"], p["used_bytes"],
                                                              p["sm_util"])
                                                 for p in g["processes"]))
                for g in node_json(env, "usage")]  # NVML, read by tessera-node itself
        usage = snapshot(gpus, {}, [share], lambda s: region_path(shares, s.key), read=read)
        found = candidates(usage)
        assert [(e.pid, e.kind, e.share_key) for e in found] == [
            (bare.proc.pid, NO_PRELOAD, share.key)], found
        message = found[0].message("team-a/old-image")
        assert "without the isolation library" in message and "not capped" in message
    finally:
        isolated.close()
        bare.close()

"""An embedded server on the fake driver's NVML (``native/fakedriver``), not on simulated GPUs:
``tessera up`` finds two "V100"s through NVML, reads their usage as the node agent does, and the
workloads are real processes (cuprobe) allocating through the fake CUDA driver, with the SM
utilisation the fake NVML reports for them (``FAKE_GPU_SM_UTIL``) — so the console has memory
used, loans and utilisation to show."""

from __future__ import annotations

import shlex
from pathlib import Path

from tessera.isolation.build import NativeBuild, ensure_built
from tessera.testing.embedded import EmbeddedServer

GiB = 2**30
V100 = "Tesla V100-SXM2-16GB=16Gi"


class FakeGpuServer(EmbeddedServer):
    """Workloads inherit the server's environment: the fake driver on the library path and one
    process-state file shared by every process (one machine)."""

    def __init__(self, root: Path, native: NativeBuild | None = None) -> None:
        super().__init__(root, simulate=())
        self.native = native or ensure_built()

    @property
    def env(self) -> dict[str, str]:
        env = super().env
        env.update({"LD_LIBRARY_PATH": str(self.native.fake_dir), "FAKE_GPU_DEVICES": f"{V100};{V100}",
                    "FAKE_GPU_STATE": str(self.root / "gpu.state"),
                    "TESSERA_USAGE_INTERVAL": "0.3", "TESSERA_HISTORY_INTERVAL": "0.5"})
        return env

    def gpu_program(self, nbytes: int, preload: bool = True) -> list[str]:
        """A pod command: cuprobe (a CUDA program on the fake driver) allocating ``nbytes`` and
        holding it; ``preload=False`` drops the isolation library (the process is then known only
        by the pod's session)."""
        probe = shlex.quote(str(self.native.program("cuprobe")))
        run = probe if preload else f"env -u LD_PRELOAD {probe}"
        return ["sh", "-c", f"(printf 'init\\nctx 0\\nalloc {nbytes}\\n'; sleep 600) | {run} dlsym"]

    def submit_gpu(self, name: str, project: str, sm_util: int, nbytes: int, *gpu: str,
                   preload: bool = True) -> None:
        self.cli("submit", name, "-p", project, *gpu, "-e", f"FAKE_GPU_SM_UTIL={sm_util}", "--",
                 *self.gpu_program(nbytes, preload))

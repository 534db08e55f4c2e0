"""An embedded server on a fake A100 in MIG mode beside a V100 (the MIG, serves-shares and console
tests share it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tessera.isolation.build import NativeBuild
from tessera.testing.embedded import EmbeddedServer
from tests.node.fake_mig import A100_40

HOLD = ["sh", "-c", "sleep 600"]


class MigServer(EmbeddedServer):
    def __init__(self, root: Path, native: NativeBuild, **extra: str) -> None:
        super().__init__(root, simulate=())
        self.native = native
        self.extra = extra

    @property
    def env(self) -> dict[str, str]:
        env = super().env
        env.update({"LD_LIBRARY_PATH": str(self.native.fake_dir),
                    "FAKE_GPU_DEVICES": f"{A100_40};{V100}", "FAKE_GPU_MIG_0": "1",
                    "FAKE_GPU_STATE": str(self.root / "gpu.state"), **self.extra})
        return env

    def machine_env(self) -> dict[str, str]:
        """The machine's NVML as another process reads it (without the server's fault knobs)."""
        return {k: v for k, v in self.env.items()
                if k not in ("FAKE_NVML_FAIL", "TESSERA_FAULT_POINT")}

    def submit(self, name: str, *args: str, project: str = "team-a") -> subprocess.CompletedProcess[str]:
        return self.cli("submit", name, "-p", project, *args, "--", *HOLD, check=False)

    def workload(self, client: httpx.Client, name: str) -> dict[str, Any]:
        wid = next(w["workloadId"] for w in client.get("/api/v1/workloads").json()["workloads"]
                   if w["name"] == name)
        doc: dict[str, Any] = client.get(f"/api/v1/workloads/trainings/{wid}").json()
        return doc

    def wait_for(self, client: httpx.Client, name: str, phase: str,
                 message: str = "") -> dict[str, Any]:
        wid = self.workload(client, name)["workloadId"]
        w = self.wait_phase(client, "trainings", wid, phase)
        while message not in w["phaseMessage"]:
            w = self.wait_phase(client, "trainings", wid, phase)
        return w

    def partitions(self) -> list[dict[str, Any]]:
        r = subprocess.run([sys.executable, "-m", "tessera.node", "mig", "--json", "--journal",
                            str(self.data / "mig-journal.json")], env=self.machine_env(),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        parts: list[dict[str, Any]] = json.loads(r.stdout)[0]["partitions"]
        return parts


def env_of(w: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = w["pods"][0]["env"]
    return env


V100 = "Tesla V100-SXM2-16GB=16Gi"

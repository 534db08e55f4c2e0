"""A simulated machine with two GPUs and two shares (train-a, infer-b), as tessera-node sees it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tessera.isolation.build import NativeBuild
from tessera.node.containers import Share, ShareDevice, config_dir
from tessera.testing.cluster import free_ports
from tests.isolation.conftest import Probe
from tests.node.conftest import H100, machine_env

GiB = 2**30
UUIDS = ["GPU-0000aaaa-1111-2222-3333-444444444444", "GPU-0000bbbb-1111-2222-3333-444444444444"]


TRAIN = Share(key="a" * 16, namespace="team-a", pod="train-a", uid="uid-a", containers=("main",),
              devices=(ShareDevice(UUIDS[0], 8 * GiB, 16 * GiB),), workload="train-a",
              project="team-a")


INFER = Share(key="b" * 16, namespace="team-b", pod="infer-b", uid="uid-b", containers=("main",),
              devices=(ShareDevice(UUIDS[0], 4 * GiB, 4 * GiB),), workload="infer-b",
              project="team-b")


class Machine:
    def __init__(self, native: NativeBuild, root: Path) -> None:
        self.native = native
        self.shares = root / "shares"
        self.env = machine_env(native, root / "gpu.state", devices=f"{H100};{H100}",
                               extra={"FAKE_GPU_UUIDS": ",".join(UUIDS)})
        self.procs: list[Probe] = []
        self.agent: subprocess.Popen[str] | None = None
        self.port = 0

    def share_process(self, share: Share, sm: int) -> Probe:
        conf = config_dir(self.shares, share.key, "main") / "gpu-isolation.conf"
        env = {**self.env, "LD_PRELOAD": str(self.native.library), "TESSERA_GPU_CONFIG": str(conf),
               "CUDA_VISIBLE_DEVICES": share.devices[0].uuid, "FAKE_GPU_SM_UTIL": str(sm)}
        p = Probe(self.native, env)
        self.procs.append(p)
        return p.start(0)

    def uncapped(self, device: int) -> Probe:
        p = Probe(self.native, {**self.env, "CUDA_VISIBLE_DEVICES": str(device)})
        self.procs.append(p)
        return p.start(0)

    def start_agent(self, on_escape: str) -> None:
        (self.port,) = free_ports(1)
        self.agent = subprocess.Popen(
            [sys.executable, "-m", "tessera.node", "local", f"--shares-dir={self.shares}",
             "--node-name=box", f"--metrics-port={self.port}", f"--on-escape={on_escape}",
             "--sync-interval=0.2"], env=self.env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)

    def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        try:
            body = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text
        except httpx.ConnectError:  # not serving yet
            assert self.agent is not None and self.agent.poll() is None, self.agent
            return {}
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for fam in text_string_to_metric_families(body):
            for s in fam.samples:
                out.setdefault(s.name, []).append((s.labels, s.value))
        return out

    def events(self) -> list[dict[str, Any]]:
        f = self.shares / "events.jsonl"
        return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []

    def stop(self) -> None:
        for p in self.procs:
            if p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait()
        if self.agent is not None and self.agent.poll() is None:
            self.agent.terminate()
            self.agent.wait(10)



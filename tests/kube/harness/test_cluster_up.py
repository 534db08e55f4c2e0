"""``python -m tessera.testing.cluster up`` runs the whole stack: a Run:ai manifest applied as
it is gets admitted (webhook), bound (scheduler) and wired (ConfigMap); the components are
separate processes, so kill -9 of the scheduler leaves the cluster up and the scheduler comes
back; simulated nodes carry no stale not-ready taint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import waiting
from tests.kube.admission_helpers import runai_pod


def wait_until(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    return waiting.wait_until(what, check, timeout, interval=0.2)


class Up:
    def __init__(self, tmp: Path) -> None:
        self.kubeconfig = tmp / "kubeconfig"
        self.err_path = tmp / "up.err"
        self.err = self.err_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tessera.testing.cluster", "up", f"--kubeconfig={self.kubeconfig}",
             "--nodes=2", "--gpus-per-node=2", "--gpu-model=L4-24GB"],
            stdout=subprocess.PIPE, stderr=self.err, text=True)
        assert self.proc.stdout is not None
        lines = []
        for line in self.proc.stdout:
            lines.append(line.strip())
            if line.strip() == "ready":
                break
        assert lines[-1:] == ["ready"], (lines, self.err_path.read_text())
        self.kubectl_path = next(x.split(": ", 1)[1] for x in lines if x.startswith("kubectl: "))
        self.workdir = next(x.split()[1] for x in self.err_path.read_text().splitlines()
                            if x.startswith("workdir:"))

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.kubectl_path, f"--kubeconfig={self.kubeconfig}", *args],
                              capture_output=True, text=True, check=check, timeout=30)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def scheduler_pids(self) -> list[int]:
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"tessera.kube.scheduler" in argv and any(self.workdir.encode() in a for a in argv):
                pids.append(int(entry.name))
        return pids

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.communicate(timeout=60)
        self.err.close()
        return self.err_path.read_text()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    u = Up(tmp_path_factory.mktemp("up"))
    try:
        yield u
    finally:
        err = u.stop()
        assert u.proc.returncode == 0, err
        assert err.rstrip().endswith("stopped")


def apply(up: Up, name: str, doc: dict[str, Any]) -> None:
    path = Path(up.workdir) / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    up.kubectl("apply", "-n", "default", "-f", str(path))


def bound(up: Up, name: str) -> dict[str, Any]:
    return wait_until(f"{name} bound", lambda: (p := up.get("pod", name, "-n", "default"))["spec"].get("nodeName")
                      and p)


def test_nodes_carry_no_stale_not_ready_taint(up: Up) -> None:
    nodes = up.get("nodes")["items"]
    assert len(nodes) == 2
    for n in nodes:
        assert not [t for t in n["spec"].get("taints") or [] if t["key"].startswith("node.kubernetes.io/")]


def test_a_runai_manifest_as_it_is_is_admitted_and_bound(up: Up) -> None:
    apply(up, "runai", runai_pod("quickstart", {"gpu-fraction": "0.5"}))
    pod = bound(up, "quickstart")
    assert pod["spec"]["schedulerName"] == "tessera"  # the webhook took it over
    ann = pod["metadata"]["annotations"]
    assert json.loads(ann["tessera.io/placement"])["devices"]
    events = up.get("events", "-n", "default", "--field-selector", "involvedObject.name=quickstart")["items"]
    assert any(e["reason"] == "Scheduled" for e in events)


def test_kill_9_of_the_scheduler_leaves_the_cluster_up(up: Up) -> None:
    (pid,) = up.scheduler_pids()
    os.kill(pid, signal.SIGKILL)
    # the API server still answers, and the supervisor brings a new scheduler
    assert up.get("nodes")["items"]
    new = wait_until("a new scheduler", lambda: [p for p in up.scheduler_pids() if p != pid])
    assert new
    apply(up, "after", runai_pod("after-restart", {"gpu-fraction": "0.25"}))
    assert bound(up, "after-restart")["spec"]["nodeName"]
    assert "tessera-scheduler exited" in up.err_path.read_text()

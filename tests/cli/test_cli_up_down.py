"""``tessera up --detach`` / ``down`` as a user runs them, and a restart keeping everything."""

from __future__ import annotations

import os
from pathlib import Path

from tessera.testing.embedded import EmbeddedServer


def test_up_down_restart_keeps_projects_and_workloads(tmp_path: Path) -> None:
    s = EmbeddedServer(tmp_path)
    env_port = str(s.port)
    try:
        r = s.cli("up", "--detach", "--port", env_port, "--data-dir", str(s.data),
                  "--simulate", "2xH100-80GB", "--grace", "1")
        assert "SIMULATED" in r.stdout and "H100-80GB" in r.stdout
        s.cli("project", "create", "keep", "--gpu", "2", "--limit", "2")
        s.cli("submit", "long", "-p", "keep", "-g", "2", "--", "sleep", "600")
        s.cli("wait", "long", "-p", "keep")
        pid = s.cli_json("describe", "long", "-p", "keep")["pods"][0]["pid"]
        assert "already up" in s.cli("up", "--detach", "--port", env_port, "--data-dir",
                                     str(s.data)).stdout
        assert "keep running" in s.cli("down", "--data-dir", str(s.data)).stdout
        assert s.cli("list", check=False).returncode == 2
        os.kill(pid, 0)
        s.cli("up", "--detach", "--port", env_port, "--data-dir", str(s.data))
        w = s.cli_json("describe", "long", "-p", "keep")
        assert w["phase"] == "Running" and w["pods"][0]["pid"] == pid
        assert w["simulated"] is True
        gpus = s.cli_json("top")["nodes"][0]["gpus"]
        assert [g["model"] for g in gpus] == ["H100-80GB", "H100-80GB"]
        projects = s.cli_json("project", "list")["projects"]
        assert projects[0]["resources"]["gpu"]["limit"] == 2
        assert "workloads stopped" in s.cli("down", "--stop-workloads", "--data-dir",
                                            str(s.data)).stdout
        try:
            os.kill(pid, 0)
            alive = True
        except ProcessLookupError:
            alive = False
        if alive:
            assert Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    finally:
        s.cli("down", "--stop-workloads", "--data-dir", str(s.data), check=False)
        s.cleanup()

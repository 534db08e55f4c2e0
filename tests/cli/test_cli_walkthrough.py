"""The seed walkthroughs, driven by the real ``tessera`` CLI against a real server."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tessera.testing.embedded import EmbeddedServer
from tests.shares import share

LOOP = "import time; [time.sleep(1) for _ in iter(int, 1)]"


def _library_built() -> bool:
    from tessera.isolation import LibraryNotBuilt, library_path

    try:
        library_path()
    except LibraryNotBuilt:
        return False
    return True


def _wait(server: EmbeddedServer, *names: str, status: str = "Running") -> None:
    server.cli("wait", *names, "--for", status, "--timeout", "20")


def test_runai_v1_walkthrough(server: EmbeddedServer) -> None:
    """runai project set team-a; submit frac05 -g 0.5 and frac03 -g 0.3; same GPU; exec."""
    server.cli("login")
    server.cli("project", "create", "team-a", "--gpu", "1")
    server.cli("project", "set", "team-a")
    server.cli("submit", "frac05", "-g", "0.5", "--interactive", "--", "python3", "-c", LOOP)
    server.cli("submit", "frac03", "-g", "0.3", "--interactive", "--", "python3", "-c", LOOP)
    _wait(server, "frac05", "frac03")

    table = server.cli("list").stdout
    assert "SIMULATED" in table.splitlines()[0]
    assert "GPUs Allocated (Requested)" in table
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:]}
    assert rows["frac05"][1] == "Running" and rows["frac03"][1] == "Running"
    assert "0.50 (0.50)" in table and "0.30 (0.30)" in table

    listed = server.cli_json("list")["workloads"]
    by_name = {w["name"]: w for w in listed}
    assert by_name["frac05"]["nodeName"] == by_name["frac03"]["nodeName"]
    assert by_name["frac05"]["gpuDevices"] == by_name["frac03"]["gpuDevices"] == "0"

    smi = server.cli("exec", "frac05", "--", "nvidia-smi").stdout
    assert "SIMULATED" in smi
    assert f"0MiB / {share(0.5) // 2**20}MiB" in smi and "0.50" in smi
    env = server.cli("exec", "frac05", "--", "env").stdout
    uuid = server.cli_json("describe", "frac05")["pods"][0]["gpuDevices"][0]["uuid"]
    assert f"CUDA_VISIBLE_DEVICES={uuid}" in env
    assert f"NVIDIA_VISIBLE_DEVICES={uuid}" in env
    pod_env = server.cli_json("describe", "frac05")["pods"][0]["env"]
    if _library_built():
        # Fail closed: a shared pod runs only with the preload and a config capping its share.
        assert pod_env["TESSERA_ISOLATION"] == "on"
        assert "libtessera-cuda.so" in pod_env["LD_PRELOAD"]
        config = Path(pod_env["TESSERA_GPU_CONFIG"]).read_text()
        assert f"uuid={uuid} request={share(0.5)} limit={share(0.5)}" in config
    else:
        assert pod_env["TESSERA_ISOLATION"] == "off"

    top = server.cli("top").stdout
    assert "SIMULATED" in top and "frac05" in top and "80%" in top

    # Exact GPU memory (seed 001): 5G does not fit next to 0.5 + 0.3 of 16 GiB, and says why.
    server.cli("submit", "mem5g", "--gpu-memory", "5G", "--", "python3", "-c", LOOP)
    time.sleep(0.5)
    described = server.cli("describe", "mem5g").stdout
    assert "Why pending: " in described and "no GPU with 4.7 GiB free" in described
    assert f"Isolation:   {'on' if _library_built() else 'off'} (" in described
    server.cli("delete", "frac03")
    _wait(server, "mem5g")
    d = server.cli_json("describe", "mem5g")
    assert d["pods"][0]["gpuDevices"][0]["requestBytes"] == 5 * 10**9
    server.cli("delete", "frac05", "mem5g")


def test_runai_v2_flags(server: EmbeddedServer) -> None:
    server.cli("project", "create", "v2", "--gpu", "1")
    common = ["-p", "v2"]
    server.cli("training", "submit", "dyn", *common, "--gpu-portion-request", "0.25",
               "--gpu-portion-limit", "0.8", "--", "sleep", "600")
    server.cli("workspace", "submit", "mem", *common, "--gpu-memory-request", "2G",
               "--gpu-memory-limit", "4G", "-e", "FOO=bar", "--", "sleep", "600")
    for name in ("dyn", "mem"):
        server.cli("wait", name, "-p", "v2", "--timeout", "20")
    dyn = server.cli_json("training", "describe", "dyn", "-p", "v2")
    assert dyn["type"] == "Training" and dyn["preemptible"] is True
    dev = dyn["pods"][0]["gpuDevices"][0]
    assert dev["requestBytes"] == share(0.25) and dev["limitBytes"] == share(0.8)
    mem = server.cli_json("workspace", "describe", "mem", "-p", "v2")
    assert mem["type"] == "Workspace" and mem["priorityClass"] == "build"
    assert mem["pods"][0]["gpuDevices"][0]["limitBytes"] == 4 * 10**9
    assert mem["pods"][0]["env"]["FOO"] == "bar"
    smi = server.cli("workspace", "exec", "mem", "-p", "v2", "--", "nvidia-smi").stdout
    assert "burst limit 3814MiB" in smi
    assert server.cli("training", "list", "-p", "v2", "-o", "yaml").stdout.count("name: dyn") == 1
    names = [w["name"] for w in server.cli_json("training", "list", "-p", "v2")["workloads"]]
    assert names == ["dyn"]
    server.cli("training", "suspend", "dyn", "-p", "v2")
    server.cli("wait", "dyn", "-p", "v2", "--for", "Stopped", "--timeout", "20")
    server.cli("training", "resume", "dyn", "-p", "v2")
    server.cli("wait", "dyn", "-p", "v2", "--timeout", "20")
    server.cli("delete", "dyn", "mem", "-p", "v2")


def test_logs_and_failed_exit_code(server: EmbeddedServer) -> None:
    server.cli("project", "create", "logs", "--gpu", "1")
    server.cli("submit", "hello", "-p", "logs", "-g", "0.1", "--", "python3", "-c",
               "print('hello from tessera'); import sys; sys.exit(7)")
    server.cli("wait", "hello", "-p", "logs", "--for", "Failed", "--timeout", "20")
    assert "hello from tessera" in server.cli("logs", "hello", "-p", "logs").stdout
    assert "hello from tessera" in server.cli("logs", "hello", "-p", "logs", "-f").stdout
    d = server.cli_json("describe", "hello", "-p", "logs")
    assert d["phase"] == "Failed" and d["exitCode"] == 7
    assert "Status:      Failed (exit code 7)" in server.cli("describe", "hello", "-p",
                                                           "logs").stdout


def test_bad_input_one_line_and_exit_codes(server: EmbeddedServer) -> None:
    server.cli("project", "create", "bad", "--gpu", "1")
    cases = [
        (["submit", "x", "-p", "bad", "-g", "1.5", "--", "true"], "-g:"),
        (["submit", "x", "-p", "bad", "--gpu-portion-request", "0.5", "--gpu-portion-limit",
          "0.2", "--", "true"], "--gpu-portion-limit:"),
        (["submit", "x", "-p", "bad", "--gpu-memory", "5X", "--", "true"], "--gpu-memory:"),
        (["submit", "x", "-p", "bad", "--gpu-memory", "40G", "--", "true"], "--gpu-memory:"),
        (["submit", "x", "-p", "bad", "-g", "0.5", "--gpu-memory", "1G", "--", "true"], "-g:"),
        (["submit", "x", "-p", "bad", "-g", "0.5"], "COMMAND:"),
        (["submit", "x", "-p", "nope", "-g", "0.5", "--", "true"], "-p:"),
        (["submit", "X_bad", "-p", "bad", "--", "true"], "NAME:"),
        (["list", "-o", "xml"], "-o/--output:"),
        (["submit", "x", "--no-such-flag"], "No such option"),
        (["describe", "ghost", "-p", "bad"], "no workload ghost"),
        (["project", "create", "bad"], "already exists"),
    ]
    for args, needle in cases:
        r = server.cli(*args, check=False)
        assert r.returncode == 1, (args, r.returncode, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], (
            args, r.stderr)
    assert json.loads(server.cli("list", "-p", "bad", "-o", "json").stdout)["total"] == 0
    server.cli("submit", "dup", "-p", "bad", "-g", "0.1", "--", "sleep", "600")
    r = server.cli("submit", "dup", "-p", "bad", "-g", "0.1", "--", "true", check=False)
    assert r.returncode == 1 and "already exists" in r.stderr
    server.cli("delete", "dup", "-p", "bad")


def test_server_unreachable_is_exit_2(server: EmbeddedServer) -> None:
    env_url = server.url
    server.url = "http://127.0.0.1:9"
    try:
        r = server.cli("list", check=False)
    finally:
        server.url = env_url
    assert r.returncode == 2
    assert r.stderr.startswith("error: cannot reach the tessera server") and len(
        r.stderr.strip().splitlines()) == 1

"""Inventory and usage read through nvidia-ml-py from the fake NVML, against its ground truth."""

from __future__ import annotations

from pathlib import Path

from tessera.isolation.build import NativeBuild
from tests.node.conftest import (
    H100,
    H100_BYTES,
    machine_env,
    node_cli,
    node_json,
    start_proc,
)

GiB = 2**30
CTX = 512 * 2**20  # the fake driver's CUDA context on an H100 (its default, as CUDA 12's)
FOUR = ";".join([H100, H100, "Tesla V100-SXM2-16GB=16Gi", "NVIDIA L4=23034Mi"])
UUIDS = [f"GPU-0000000{i}-1111-2222-3333-44444444444{i}" for i in range(4)]


def test_inventory_matches_the_fake_driver(native: NativeBuild) -> None:
    env = machine_env(native, None, devices=FOUR, extra={
        "FAKE_GPU_UUIDS": ",".join(UUIDS), "FAKE_GPU_MIG_1": "1", "FAKE_GPU_NVLINK": "pairs",
        "FAKE_NVML_DRIVER_VERSION": "570.133.20", "FAKE_CUDA_DRIVER_VERSION": "12080"})
    inv = node_json(env, "inventory")
    assert inv["driver_version"] == "570.133.20"
    assert inv["cuda_version"] == "12.8"
    gpus = inv["gpus"]
    assert [g["uuid"] for g in gpus] == UUIDS
    assert [g["index"] for g in gpus] == [0, 1, 2, 3]
    assert [g["model"] for g in gpus] == ["H100-80GB", "H100-80GB", "V100-16GB", "L4-22GB"]
    assert [g["memory_total"] for g in gpus] == [H100_BYTES, H100_BYTES, 16 * GiB, 23034 * 2**20]
    assert [g["mig_enabled"] for g in gpus] == [False, True, False, False]
    assert [tuple(g["compute_capability"]) for g in gpus] == [(9, 0), (9, 0), (7, 0), (8, 9)]
    assert [g["minor"] for g in gpus] == [0, 1, 2, 3]
    links = {(link["a"], link["b"]): (link["ancestor"], link["nvlink"]) for link in inv["links"]}
    assert links == {
        (0, 1): ("single", True), (2, 3): ("single", True),
        (0, 2): ("system", False), (0, 3): ("system", False),
        (1, 2): ("system", False), (1, 3): ("system", False),
    }


def test_usage_lists_processes_with_their_memory_and_utilisation(native: NativeBuild, tmp_path: Path,
                                                                  gpu_procs: list) -> None:
    state = tmp_path / "gpu.state"
    env = machine_env(native, state, devices=f"{H100};{H100}",
                      extra={"FAKE_GPU_USED_1": "1Gi"})
    a = start_proc(native, gpu_procs, {**env, "FAKE_GPU_SM_UTIL": "30"}, device=0)
    b = start_proc(native, gpu_procs, {**env, "FAKE_GPU_SM_UTIL": "45"}, device=0)
    c = start_proc(native, gpu_procs, {**env, "FAKE_GPU_SM_UTIL": "10"}, device=1)
    a.alloc(3 * GiB)
    b.alloc(5 * GiB)
    b.alloc(1 * GiB)
    c.alloc(2 * GiB)
    usage = node_json(env, "usage")
    procs0 = {p["pid"]: (p["used_bytes"], p["sm_util"]) for p in usage[0]["processes"]}
    # NVML counts each process's CUDA context in its memory, as the real driver does
    assert procs0 == {a.proc.pid: (3 * GiB + CTX, 30), b.proc.pid: (6 * GiB + CTX, 45)}
    assert usage[0]["memory_used"] == 9 * GiB + 2 * CTX
    assert usage[0]["utilization"] == 75
    procs1 = {p["pid"]: p["used_bytes"] for p in usage[1]["processes"]}
    assert procs1 == {c.proc.pid: 2 * GiB + CTX}
    assert usage[1]["memory_used"] == 3 * GiB + CTX  # the process + FAKE_GPU_USED_1
    # One GPU, shared by processes: what one holds, another cannot have.
    free, total = a.info()
    assert total == H100_BYTES and free == H100_BYTES - 9 * GiB - 2 * CTX
    # A killed process's memory is freed and it leaves the list, as with the real driver.
    b.proc.kill()
    b.proc.wait()
    usage = node_json(env, "usage")
    assert {p["pid"] for p in usage[0]["processes"]} == {a.proc.pid}
    assert usage[0]["memory_used"] == 3 * GiB + CTX
    assert a.info()[0] == H100_BYTES - 3 * GiB - CTX


def test_no_nvml_is_one_line(native: NativeBuild) -> None:
    env = machine_env(native, None)
    env["LD_LIBRARY_PATH"] = "/nonexistent"
    r = node_cli(env, "inventory")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "NVML could not be initialised" in lines[0], r.stderr


def test_embedded_mode_uses_the_node_inventory(native: NativeBuild) -> None:
    import subprocess
    import sys
    env = machine_env(native, None, devices=f"{H100};Tesla V100-SXM2-16GB=16Gi",
                      extra={"FAKE_GPU_UUIDS": ",".join(UUIDS[:2])})
    code = ("from tessera.local.gpus import discover; m = discover(None, 's'); "
            "print(m.simulated, [(g.uuid, g.model, g.memory) for g in m.node.gpus])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == (f"False [('{UUIDS[0]}', 'H100-80GB', {H100_BYTES}), "
                           f"('{UUIDS[1]}', 'V100-16GB', {16 * GiB})]")


def test_headroom_measured_by_a_real_context_on_the_fake_driver(native: NativeBuild,
                                                                  tmp_path: Path) -> None:
    """One CUDA context created per model through libcuda; NVML's memory for that process is
    the headroom (the fake driver charges FAKE_GPU_CONTEXT_BYTES per context)."""
    env = machine_env(native, tmp_path / "gpu.state", devices=f"{H100};{H100}",
                      extra={"FAKE_GPU_CONTEXT_BYTES": "537Mi"})
    inv = node_json(env, "inventory")
    assert [(g["headroom"], g["headroom_source"]) for g in inv["gpus"]] == [
        (537 * 2**20, "measured"), (537 * 2**20, "measured")]
    # Without the shared process state, the change in used memory gives the same figure.
    inv = node_json(machine_env(native, None, devices=H100,
                                extra={"FAKE_GPU_CONTEXT_BYTES": "300Mi"}), "inventory")
    assert (inv["gpus"][0]["headroom"], inv["gpus"][0]["headroom_source"]) == (
        300 * 2**20, "measured")


def test_headroom_falls_back_to_the_model_default_never_zero(native: NativeBuild) -> None:
    env = machine_env(native, None, devices=FOUR, extra={"FAKE_GPU_CONTEXT_BYTES": "0"})
    inv = node_json(env, "inventory")
    assert [g["headroom_source"] for g in inv["gpus"]] == ["default"] * 4
    assert [g["headroom"] // 2**20 for g in inv["gpus"]] == [512, 512, 320, 448]
    inv = node_json(env, "inventory", "--headroom", "1Gi")
    assert {(g["headroom"], g["headroom_source"]) for g in inv["gpus"]} == {(GiB, "configured")}
    r = node_cli(env, "inventory", "--headroom", "0")
    assert r.returncode != 0 and "--headroom" in r.stderr
    r = node_cli(env, "inventory", "--headroom", "lots")
    assert r.returncode != 0 and "--headroom" in r.stderr


def test_embedded_mode_reads_nvlink_islands_from_nvml(native: NativeBuild) -> None:
    """NVLink between devices 0+1 and 2+3 (the fake's `pairs`) becomes two islands in the node
    the embedded scheduler places on; with no NVLink every device is its own island."""
    import subprocess
    import sys
    code = "from tessera.local.gpus import discover; print(discover(None, 's').node.nvlink)"
    seen = {}
    for nvlink in ("pairs", "none", "all"):
        env = machine_env(native, None, devices=";".join([H100] * 4),
                          extra={"FAKE_GPU_NVLINK": nvlink})
        seen[nvlink] = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                      text=True, timeout=60, check=True).stdout.strip()
    assert seen == {"pairs": "(0, 0, 1, 1)", "none": "(0, 1, 2, 3)", "all": "(0, 0, 0, 0)"}

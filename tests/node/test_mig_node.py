"""tessera-node's MIG partitions (tessera.node.mig) on the fake NVML, in real processes: the
inventory, create and remove, NVML's errors as reasons with nothing half-made left, and the
journal that makes a process killed mid-create or mid-remove leak nothing and create nothing
twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tessera.isolation.build import NativeBuild
from tests.node.conftest import machine_env, node_cli, node_json, start_proc
from tests.node.fake_mig import A100_40, nvml

MACHINE = f"{A100_40};{A100_40};Tesla V100-SXM2-16GB=16Gi"


def env_for(native: NativeBuild, tmp_path: Path, **extra: str) -> dict[str, str]:
    return machine_env(native, tmp_path / "gpu.state", devices=MACHINE,
                       extra={"FAKE_GPU_MIG_0": "1", **extra})


def mig(env: dict[str, str], tmp_path: Path, *args: str) -> Any:
    return node_json(env, "mig", *args, "--journal", str(tmp_path / "journal.json"))


def journal(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "journal.json").read_text())


def nvml_partitions(env: dict[str, str]) -> list[list[Any]]:
    """What NVML lists on GPU 0, read by another process: [gi, start, size, MIG uuid]."""
    return nvml(env, """
    out = []
    for i in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            m = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
        except nv.NVMLError_NotFound:
            continue
        gi = nv.nvmlDeviceGetGpuInstanceById(h, nv.nvmlDeviceGetGpuInstanceId(m))
        info = nv.nvmlGpuInstanceGetInfo(gi)
        out.append([info.id, info.placement.start, info.placement.size, nv.nvmlDeviceGetUUID(m)])
    gis = 0
    for pid in (19, 20, 15, 14, 9, 5, 0):
        count = ctypes.c_uint(0)
        buf = (nv.c_nvmlGpuInstance_t * 8)()
        nv.nvmlDeviceGetGpuInstances(h, pid, buf, ctypes.byref(count))
        gis += count.value
    out.append(gis)
    """)


def test_inventory_reports_mig_mode_profiles_and_partitions(native: NativeBuild,
                                                             tmp_path: Path) -> None:
    env = env_for(native, tmp_path)
    gpus = mig(env, tmp_path)
    assert [g["mig_enabled"] for g in gpus] == [True, False, None]
    assert [g["model"] for g in gpus] == ["A100-40GB", "A100-40GB", "V100-16GB"]
    profiles = {p["name"]: p for p in gpus[0]["profiles"]}
    assert profiles["3g.20gb"]["placements"] == [[0, 4], [4, 4]]
    assert profiles["3g.20gb"]["compute"] == 3
    assert gpus[1]["profiles"] == [] and gpus[0]["partitions"] == []


def test_create_reports_the_mig_uuid_and_remove_gives_the_room_back(native: NativeBuild,
                                                                    tmp_path: Path) -> None:
    env = env_for(native, tmp_path)
    made = mig(env, tmp_path, "create", "0", "3g.20gb", "4", "--owner", "team-a/train")
    assert made["uuid"].startswith("MIG-") and made["start"] == 4 and made["managed"]
    assert made["owner"] == "team-a/train"
    # Another process reading NVML sees the same partition.
    assert nvml_partitions(env) == [[made["gi"], 4, 4, made["uuid"]], 1]
    assert journal(tmp_path)["intents"] == []
    assert [p["uuid"] for p in journal(tmp_path)["partitions"]] == [made["uuid"]]
    shown = mig(env, tmp_path)[0]["partitions"]
    assert [(p["profile"], p["uuid"], p["owner"], p["managed"]) for p in shown] == [
        ("3g.20gb", made["uuid"], "team-a/train", True)]
    held = node_cli(env, "mig", "remove", "0", str(made["gi"]), "--journal",
                    str(tmp_path / "journal.json"))
    assert held.returncode == 1 and "held by team-a/train" in held.stderr
    # Released (the workload ended), it can go.
    j = journal(tmp_path)
    j["partitions"][0]["owner"] = None
    (tmp_path / "journal.json").write_text(json.dumps(j))
    r = node_cli(env, "mig", "remove", "0", str(made["gi"]), "--journal",
                 str(tmp_path / "journal.json"))
    assert r.returncode == 0, r.stderr
    assert nvml_partitions(env) == [0]
    assert journal(tmp_path) == {"version": 1, "partitions": [], "intents": []}


def failed(env: dict[str, str], tmp_path: Path, *args: str) -> str:
    r = node_cli(env, "mig", *args, "--journal", str(tmp_path / "journal.json"))
    assert r.returncode == 1, r.stdout
    return r.stderr.strip()


def test_bad_requests_and_nvml_errors_leave_nothing_behind(native: NativeBuild,
                                                           tmp_path: Path) -> None:
    env = env_for(native, tmp_path)
    assert "GPU 1" in failed(env, tmp_path, "create", "1", "3g.20gb", "0") and \
        "not in MIG mode" in failed(env, tmp_path, "create", "1", "3g.20gb", "0")
    assert "has no MIG" in failed(env, tmp_path, "create", "2", "1g.5gb", "0")
    assert "no MIG profile 3g.40gb" in failed(env, tmp_path, "create", "0", "3g.40gb", "0")
    assert "cannot start at memory slot 2 on GPU 0" in failed(env, tmp_path, "create", "0",
                                                              "3g.20gb", "2")
    first = mig(env, tmp_path, "create", "0", "4g.20gb", "0")
    overlap = failed(env, tmp_path, "create", "0", "3g.20gb", "0")
    assert "creating 3g.20gb at memory slot 0 on GPU 0" in overlap
    assert "Insufficient Resources" in overlap or "Insufficient resources" in overlap
    # The compute instance fails: the GPU instance made for it is removed again.
    ci_fails = {**env, "FAKE_NVML_FAIL": "nvmlGpuInstanceCreateComputeInstance=23"}
    reason = failed(ci_fails, tmp_path, "create", "0", "3g.20gb", "4")
    assert "creating the compute instance of 3g.20gb on GPU 0" in reason
    assert [p[:3] for p in nvml_partitions(env)[:-1]] == [[first["gi"], 0, 4]]
    assert nvml_partitions(env)[-1] == 1
    assert journal(tmp_path)["intents"] == []
    assert len(journal(tmp_path)["partitions"]) == 1


def test_a_partition_tessera_did_not_make_is_reported_and_left_alone(native: NativeBuild,
                                                                     tmp_path: Path) -> None:
    env = env_for(native, tmp_path)
    theirs = nvml(env, """
    gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(h, 14, place(2, 2))
    nv.nvmlGpuInstanceCreateComputeInstance(gi, 1)
    out = nv.nvmlGpuInstanceGetInfo(gi).id
    """)
    parts = mig(env, tmp_path)[0]["partitions"]
    assert [(p["profile"], p["managed"], p["gi"]) for p in parts] == [("2g.10gb", False, theirs)]
    assert "not made by tessera" in failed(env, tmp_path, "remove", "0", str(theirs))
    assert reconcile(env, tmp_path) == []  # reconcile leaves it too
    assert [p["gi"] for p in mig(env, tmp_path)[0]["partitions"]] == [theirs]


def test_remove_refused_while_a_process_runs_on_the_partition(native: NativeBuild, tmp_path: Path,
                                                              gpu_procs: list) -> None:
    env = env_for(native, tmp_path)
    made = mig(env, tmp_path, "create", "0", "1g.5gb", "6")
    probe = start_proc(native, gpu_procs, {**env, "CUDA_VISIBLE_DEVICES": made["uuid"]})
    probe.alloc(2**30)
    assert mig(env, tmp_path)[0]["partitions"][0]["processes"] == 1
    reason = failed(env, tmp_path, "remove", "0", str(made["gi"]))
    assert "removing the 1g.5gb partition" in reason and "In use" in reason
    assert len(journal(tmp_path)["partitions"]) == 1 and journal(tmp_path)["intents"] == []
    probe.proc.kill()
    probe.proc.wait()
    assert node_cli(env, "mig", "remove", "0", str(made["gi"]), "--journal",
                    str(tmp_path / "journal.json")).returncode == 0


def killed_at(env: dict[str, str], tmp_path: Path, point: str, *args: str) -> None:
    r = node_cli({**env, "TESSERA_FAULT_POINT": point}, "mig", *args, "--journal",
                 str(tmp_path / "journal.json"))
    assert r.returncode == -9, (r.returncode, r.stderr)


def reconcile(env: dict[str, str], tmp_path: Path) -> list[str]:
    r = node_cli(env, "mig", "reconcile", "--journal", str(tmp_path / "journal.json"))
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_killed_between_the_journal_and_the_create_leaves_nothing(native: NativeBuild,
                                                                  tmp_path: Path) -> None:
    env = env_for(native, tmp_path)
    killed_at(env, tmp_path, "mig-create-intent", "create", "0", "3g.20gb", "0")
    assert [i["op"] for i in journal(tmp_path)["intents"]] == ["create"]
    assert nvml_partitions(env) == [0]
    assert reconcile(env, tmp_path) == [
        f"dropped the create of 3g.20gb at slot 0 on {mig(env, tmp_path)[0]['uuid']}: "
        "it never happened"]
    assert journal(tmp_path) == {"version": 1, "partitions": [], "intents": []}


def test_killed_after_the_gpu_instance_adopts_it_once(native: NativeBuild, tmp_path: Path) -> None:
    env = env_for(native, tmp_path)
    killed_at(env, tmp_path, "mig-create-gi", "create", "0", "3g.20gb", "4")
    assert nvml_partitions(env) == [1]  # a GPU instance, no compute instance yet
    lines = reconcile(env, tmp_path)
    assert len(lines) == 1 and lines[0].startswith("adopted the 3g.20gb partition MIG-")
    parts = mig(env, tmp_path)[0]["partitions"]
    assert [(p["start"], p["managed"], p["owner"], p["uuid"] is not None) for p in parts] == [
        (4, True, None, True)]
    assert nvml_partitions(env)[-1] == 1
    assert reconcile(env, tmp_path) == []  # a second start changes nothing
    assert len(journal(tmp_path)["partitions"]) == 1


def test_killed_mid_remove_finishes_the_remove(native: NativeBuild, tmp_path: Path) -> None:
    env = env_for(native, tmp_path)
    made = mig(env, tmp_path, "create", "0", "2g.10gb", "0")
    killed_at(env, tmp_path, "mig-destroy-intent", "remove", "0", str(made["gi"]))
    assert nvml_partitions(env)[-1] == 1
    assert reconcile(env, tmp_path) == [
        f"finished removing GPU instance {made['gi']} on {made['gpu_uuid']}"]
    assert nvml_partitions(env) == [0]
    assert journal(tmp_path) == {"version": 1, "partitions": [], "intents": []}


def test_a_journal_entry_nvml_no_longer_lists_is_forgotten(native: NativeBuild,
                                                          tmp_path: Path) -> None:
    env = env_for(native, tmp_path)
    made = mig(env, tmp_path, "create", "0", "1g.10gb", "2")
    nvml(env, f"""
    gi = nv.nvmlDeviceGetGpuInstanceById(h, {made['gi']})
    nv.nvmlComputeInstanceDestroy(nv.nvmlGpuInstanceGetComputeInstanceById(gi, 0))
    nv.nvmlGpuInstanceDestroy(gi)
    out = 0
    """)
    assert reconcile(env, tmp_path) == [
        f"forgot the 1g.10gb partition on {made['gpu_uuid']}: NVML no longer lists it"]
    assert journal(tmp_path)["partitions"] == []

"""MIG in embedded mode, end to end: a real ``tessera up`` on the fake NVML with an A100-40GB an
operator put in MIG mode and a V100 that is whole; requests through the real CLI and REST API;
partitions made, reused and left idle by the server through NVML; workload processes that see
only their MIG device; refusals and waits that say why; a server killed mid-create."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.isolation.build import NativeBuild, ensure_built
from tessera.testing.embedded import EmbeddedServer
from tests.local.mig_server import HOLD, MigServer, env_of
from tests.node.fake_mig import A100_40, nvml
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def native() -> NativeBuild:
    return ensure_built()


@pytest.fixture
def server(native: NativeBuild, tmp_path: Path) -> Iterator[MigServer]:
    s = MigServer(tmp_path, native)
    with s.serving("team-a"):
        yield s


def test_partitions_are_made_reused_and_kept_idle(server: MigServer) -> None:
    # The V100 is the cycle's GPU 0; the A100 (NVML's 0) is served by partitions.
    assert "NVML GPUs: 0:V100-16GB; in MIG mode: 0:A100-40GB" in \
        (server.root / "server.log").read_text()
    with server.http() as client:
        assert server.submit("m1", "--gpu-mig-profile", "3g.20gb").returncode == 0
        m1 = server.wait_for(client, "m1", "Running")
        uuid1 = env_of(m1)["NVIDIA_VISIBLE_DEVICES"]
        assert uuid1.startswith("MIG-") and env_of(m1)["CUDA_VISIBLE_DEVICES"] == uuid1
        assert m1["spec"]["compute"] == {"gpuMigProfile": "3g.20gb"}
        assert m1["gpus"] == {"requested": 0.429, "allocated": 0.429, "request": "MIG 3g.20gb"}
        assert "MIG 3g.20gb on GPU 0 (made at memory slot" in m1["phaseMessage"]
        # The GPU operator's spelling through the REST API.
        r = client.post("/api/v1/workloads/trainings", json={
            "name": "m2", "projectId": "team-a",
            "spec": {"command": "sleep", "args": "600",
                     "compute": {"gpuMigProfile": "nvidia.com/mig-3g.20gb"}}})
        assert r.status_code == 202, r.text
        uuid2 = env_of(server.wait_for(client, "m2", "Running"))["NVIDIA_VISIBLE_DEVICES"]
        assert uuid2 != uuid1
        assert server.submit("m3", "--gpu-mig-profile", "MIG 3g.20gb").returncode == 0
        waits = server.wait_for(client, "m3", "Pending", "no room")
        assert waits["phaseMessage"] == (
            "no room for MIG 3g.20gb on this machine's MIG GPUs (GPU 0 A100-40GB: "
            "3g.20gb busy, 3g.20gb busy)")
        # Quota counts each 3g.20gb as 3/7 of a GPU.
        assert client.get("/api/v1/org-unit/projects/team-a").json()["status"]["allocated"]["gpu"] == 0.858
        # A shared request goes to the whole V100, never to the MIG GPU.
        assert server.cli("submit", "s1", "-p", "team-a", "-g", "0.5", "--", *HOLD).returncode == 0
        s1 = server.wait_for(client, "s1", "Running")
        v100 = nvml(server.machine_env(), "out = nv.nvmlDeviceGetUUID("
                                          "nv.nvmlDeviceGetHandleByIndex(1))")
        assert [d["uuid"] for d in s1["pods"][0]["gpuDevices"]] == [v100]
        # m1 ends: its partition stays, idle, and m3 gets it as it is.
        server.cli("delete", "m1", "-p", "team-a")
        m3 = server.wait_for(client, "m3", "Running")
        assert env_of(m3)["NVIDIA_VISIBLE_DEVICES"] == uuid1
        assert "an idle partition reused" in m3["phaseMessage"]
        owners = {p["uuid"]: p["owner"] for p in server.partitions()}
        assert owners == {uuid1: m3["workloadId"],
                          uuid2: server.workload(client, "m2")["workloadId"]}
        top = server.cli("top").stdout
        slots = {p["uuid"]: p["start"] for p in server.partitions()}
        shown = sorted([f"3g.20gb@{slots[uuid1]} m3", f"3g.20gb@{slots[uuid2]} m2"],
                       key=lambda t: t.split("@")[1])
        assert f"NVML GPU 0 A100-40GB in MIG mode: {', '.join(shown)}" in top, top
        # Ended workloads leave idle partitions; a profile that needs their room removes them.
        server.cli("delete", "m2", "-p", "team-a")
        server.cli("delete", "m3", "-p", "team-a")
        assert server.submit("big", "--gpu-mig-profile", "7g.40gb").returncode == 0
        big = server.wait_for(client, "big", "Running")
        assert "after removing 2 idle partition(s)" in big["phaseMessage"]
        assert [(p["profile"], p["owner"]) for p in server.partitions()] == [
            ("7g.40gb", big["workloadId"])]


def test_bad_requests_are_refused_naming_the_flag_and_what_exists(server: MigServer) -> None:
    r = server.submit("x", "--gpu-mig-profile", "5g.20gb")
    assert r.returncode != 0
    assert "--gpu-mig-profile: is not a MIG profile of any GPU tessera knows (1g.5gb," in r.stderr
    r = server.submit("x", "--gpu-mig-profile", "3g.40gb")
    assert r.returncode != 0
    assert ("--gpu-mig-profile: no GPU in MIG mode on this machine has this profile (MIG profiles "
            "here: A100-40GB: "
            "1g.5gb, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb) (got '3g.40gb')") in r.stderr
    r = server.submit("x", "-g", "0.5", "--gpu-mig-profile", "3g.20gb")
    assert "--gpu-mig-profile: give a MIG profile or -g/--gpu, not both" in r.stderr
    r = server.submit("x", "--gpu-mig-profile", "1g.5gb", "--workers", "2")
    assert ("--workers: must be at most 1 with gpuMigProfile on this machine (one partition, "
            "one pod) (got 2)") in r.stderr
    with server.http() as client:
        r = client.post("/api/v1/workloads/trainings", json={
            "name": "x", "projectId": "team-a", "spec": {"command": "true", "compute": {
                "gpuMigProfile": "3g.20gb", "gpuPortionRequest": 0.5}}})
        assert r.status_code == 422 and "gpuPortionRequest: must be empty with gpuMigProfile" in \
            r.json()["message"]
        server.cli("project", "create", "small", "--gpu", "0.5", "--limit", "0.5")
        r4 = server.submit("x", "--gpu-mig-profile", "4g.20gb", project="small")
        assert "--gpu-mig-profile: counts as 0.571 GPU, more than project small's limit 0.5" in \
            r4.stderr
        assert server.submit("q1", "--gpu-mig-profile", "3g.20gb", project="small").returncode == 0
        server.wait_for(client, "q1", "Running")
        assert server.submit("q2", "--gpu-mig-profile", "1g.5gb", project="small").returncode == 0
        q2 = server.wait_for(client, "q2", "Pending", "limit")
        assert q2["phaseMessage"] == ("project small is at its limit of 0.5 GPU: 0.43 in use, "
                                      "this needs 0.14 more")


def test_no_mig_gpu_on_the_machine(tmp_path: Path) -> None:
    s = EmbeddedServer(tmp_path).start()  # a simulated V100: no MIG
    try:
        s.cli("login")
        s.cli("project", "create", "team-a", "--gpu", "1")
        r = s.cli("submit", "x", "-p", "team-a", "--gpu-mig-profile", "1g.5gb", "--", "true",
                  check=False)
        assert r.returncode != 0
        assert ("--gpu-mig-profile: no GPU in MIG mode on this machine (MIG mode is an "
                "operator's choice") in r.stderr
    finally:
        s.cleanup()


def test_an_nvml_error_is_the_reason_and_nothing_is_left(native: NativeBuild,
                                                         tmp_path: Path) -> None:
    s = MigServer(tmp_path, native,
                  FAKE_NVML_FAIL="nvmlGpuInstanceCreateComputeInstance=23").start()
    try:
        s.cli("login")
        s.cli("project", "create", "team-a", "--gpu", "1")
        assert s.submit("m", "--gpu-mig-profile", "2g.10gb").returncode == 0
        with s.http() as client:
            w = s.wait_for(client, "m", "Pending", "NVML")
        assert w["phaseMessage"].startswith(
            "waiting: creating the compute instance of 2g.10gb on GPU 0 (GPU-")
        assert w["phaseMessage"].endswith("NVML error: Insufficient resources")
        assert s.partitions() == []
    finally:
        s.cleanup()


def test_a_server_killed_mid_create_adopts_the_partition_once(native: NativeBuild,
                                                             tmp_path: Path) -> None:
    s = MigServer(tmp_path, native, TESSERA_FAULT_POINT="mig-create-gi").start()
    try:
        s.cli("login")
        s.cli("project", "create", "team-a", "--gpu", "1")
        s.submit("m", "--gpu-mig-profile", "3g.20gb")
        assert s.proc is not None and s.proc.wait(timeout=30) == -9
        assert [(p["managed"], p["uuid"]) for p in s.partitions()] == [(False, None)]
        s.extra = {}
        s.start()
        with s.http() as client:
            w = s.wait_for(client, "m", "Running")
        parts = s.partitions()
        assert len(parts) == 1 and parts[0]["managed"]
        assert env_of(w)["NVIDIA_VISIBLE_DEVICES"] == parts[0]["uuid"]
        assert "an idle partition reused" in w["phaseMessage"]
        assert "adopted the 3g.20gb partition" in (tmp_path / "server.log").read_text()
    finally:
        s.cleanup()


def test_a_restart_keeps_running_workloads_partitions(server: MigServer) -> None:
    with server.http() as client:
        assert server.submit("m1", "--gpu-mig-profile", "3g.20gb").returncode == 0
        uuid1 = env_of(server.wait_for(client, "m1", "Running"))["NVIDIA_VISIBLE_DEVICES"]
    server.stop(stop_workloads=False)
    server.start()
    with server.http() as client:
        m1 = server.wait_for(client, "m1", "Running")
        assert env_of(m1)["NVIDIA_VISIBLE_DEVICES"] == uuid1
        assert server.submit("m2", "--gpu-mig-profile", "3g.20gb").returncode == 0
        uuid2 = env_of(server.wait_for(client, "m2", "Running"))["NVIDIA_VISIBLE_DEVICES"]
        assert uuid2 != uuid1
        owners = {p["uuid"]: p["owner"] for p in server.partitions()}
        assert owners == {uuid1: m1["workloadId"],
                          uuid2: server.workload(client, "m2")["workloadId"]}


def test_the_cycle_counts_running_partitions_in_the_projects_quota(server: MigServer) -> None:
    """A running 3g.20gb counts as 3/7 of a GPU for the scheduling cycle too: a share that
    would take the project past its limit waits, one that fits starts."""
    server.cli("project", "create", "lim", "--gpu", "1", "--limit", "1")
    with server.http() as client:
        assert server.submit("m", "--gpu-mig-profile", "3g.20gb", project="lim").returncode == 0
        server.wait_for(client, "m", "Running")
        assert server.cli("submit", "big", "-p", "lim", "-g", "0.75", "--",
                          *HOLD).returncode == 0
        big = server.wait_for(client, "big", "Pending", "limit")
        assert big["phaseMessage"] == ("project lim is at its limit of 1 GPU: 0.43 in use, this "
                                       "needs 0.75 more")
        assert server.cli("submit", "half", "-p", "lim", "-g", "0.5", "--", *HOLD).returncode == 0
        server.wait_for(client, "half", "Running")


def test_image_gets_its_mig_device(native: NativeBuild, tmp_path: Path) -> None:
    """``submit -i IMAGE --gpu-mig-profile``: the container runtime (the stand-in podman of
    tests/cli/test_container_runtime.py: no container can run here) is asked to run the image
    with the partition's MIG UUID as its device and no isolation library (MIG isolates in
    hardware)."""
    import stat
    from collections.abc import Sequence

    from tests.cli.fake_runtime import FAKE_RUNTIME

    bindir, state = tmp_path / "bin", tmp_path / "state"
    bindir.mkdir()
    state.mkdir()
    podman = bindir / "podman"
    podman.write_text(FAKE_RUNTIME)
    podman.chmod(podman.stat().st_mode | stat.S_IXUSR)

    class RuntimeMigServer(MigServer):
        @property
        def env(self) -> dict[str, str]:
            env = super().env
            env["PATH"] = f"{bindir}:{env.get('PATH', '')}"
            env["FAKE_RUNTIME_STATE"] = str(state)
            return env

        def server_argv(self, simulate: Sequence[str] | None) -> list[str]:
            return [*super().server_argv(simulate), "--runtime", "podman"]

    s = RuntimeMigServer(tmp_path / "srv", native)
    with s.serving("team-a"), s.http() as client:
        s.cli("submit", "img", "-p", "team-a", "--gpu-mig-profile", "1g.5gb", "-i", "cuda-app")
        w = s.wait_for(client, "img", "Running")
        uuid = w["phaseMessage"].rsplit(" ", 1)[-1]
        assert uuid.startswith("MIG-"), w["phaseMessage"]

        def runs() -> list[list[str]] | None:
            path = state / "calls.jsonl"
            calls = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
            return [c for c in calls if c and c[0] == "run"] or None
        [run] = wait_until("the runtime asked to run the image", runs)
        assert run[-1] == "cuda-app", run
        envs = dict(run[i + 1].split("=", 1) for i, a in enumerate(run) if a == "--env")
        assert envs["NVIDIA_VISIBLE_DEVICES"] == envs["CUDA_VISIBLE_DEVICES"] == uuid, envs
        assert envs["TESSERA_MIG_PROFILE"] == "1g.5gb" and "LD_PRELOAD" not in envs, envs
        assert not [a for a in run if a.startswith("--volume")], run
        assert [p["uuid"] for p in s.partitions()] == [uuid]


# ---- reclaim and preemption make MIG room (tessera.core.cycle.mig_room) ----------------------

def test_a_project_below_its_deserved_quota_reclaims_a_mig_slot(server: MigServer) -> None:
    """A project with no deserved GPUs holds both 3g.20gb; team-a (deserving 1 GPU) asks a
    3g.20gb: one holder is stopped and requeued (reclaimed), its partition idle, and team-a's
    workload runs on it as it is (same MIG UUID)."""
    server.cli("project", "create", "hog", "--gpu", "0")
    with server.http() as client:
        for name in ("h1", "h2"):
            assert server.submit(name, "--gpu-mig-profile", "3g.20gb", project="hog").returncode == 0
        held = {name: env_of(server.wait_for(client, name, "Running"))["NVIDIA_VISIBLE_DEVICES"]
                for name in ("h1", "h2")}
        assert server.submit("t1", "--gpu-mig-profile", "3g.20gb").returncode == 0
        t1 = server.wait_for(client, "t1", "Running")
        docs = {name: server.workload(client, name) for name in ("h1", "h2")}
        victims = [n for n, d in docs.items() if d["phase"] == "Pending"]
        assert len(victims) == 1, docs
        (victim,) = victims
        assert [e["message"] for e in docs[victim]["events"] if e["kind"] == "Preempted"
                and e["message"].startswith("reclaimed for t1")], docs[victim]["events"]
        assert docs[({"h1", "h2"} - {victim}).pop()]["phase"] == "Running"
        assert env_of(t1)["NVIDIA_VISIBLE_DEVICES"] == held[victim]
        assert "an idle partition reused" in t1["phaseMessage"]
        # The victim waits: team-a keeps what it reclaimed, hog's other one keeps running.
        server.wait_for(client, victim, "Pending", "no room for MIG 3g.20gb")


def test_a_higher_priority_workload_preempts_a_mig_slot_in_its_project(server: MigServer) -> None:
    """Two train workloads hold both 3g.20gb; an inference workload of the same project
    preempts one and runs on its partition."""
    with server.http() as client:
        for name in ("low1", "low2"):
            assert server.submit(name, "--gpu-mig-profile", "3g.20gb").returncode == 0
        held = {name: env_of(server.wait_for(client, name, "Running"))["NVIDIA_VISIBLE_DEVICES"]
                for name in ("low1", "low2")}
        assert server.submit("urgent", "--gpu-mig-profile", "3g.20gb",
                             "--priority", "inference").returncode == 0
        urgent = server.wait_for(client, "urgent", "Running")
        docs = {name: server.workload(client, name) for name in ("low1", "low2")}
        victims = [n for n, d in docs.items() if d["phase"] == "Pending"]
        assert len(victims) == 1, docs
        assert [e for e in docs[victims[0]]["events"] if e["kind"] == "Preempted"
                and e["message"].startswith("preempted by urgent")], docs[victims[0]]["events"]
        assert env_of(urgent)["NVIDIA_VISIBLE_DEVICES"] == held[victims[0]]


def test_nobody_is_evicted_when_no_eviction_makes_room(server: MigServer) -> None:
    """A 7g.40gb needs the whole GPU; half is held by its own project's workload (same
    priority: not a victim), so evicting the other project's (which reclaim may take) would
    not make room: nobody is evicted, and the reason says so."""
    server.cli("project", "create", "hog", "--gpu", "0")
    server.cli("project", "create", "big", "--gpu", "2")
    with server.http() as client:
        assert server.submit("h1", "--gpu-mig-profile", "3g.20gb", project="hog").returncode == 0
        server.wait_for(client, "h1", "Running")
        assert server.submit("b1", "--gpu-mig-profile", "3g.20gb", project="big").returncode == 0
        server.wait_for(client, "b1", "Running")
        assert server.submit("b2", "--gpu-mig-profile", "7g.40gb", project="big").returncode == 0
        b2 = server.wait_for(client, "b2", "Pending", "reclaim found no")
        assert b2["phaseMessage"].startswith("no room for MIG 7g.40gb on this machine's MIG GPUs")
        assert server.workload(client, "h1")["phase"] == "Running"
        assert server.workload(client, "b1")["phase"] == "Running"


def test_the_runai_dynamic_mig_quickstart(native: NativeBuild, tmp_path: Path) -> None:
    """Run:ai's quickstart "Launch Workloads with NVIDIA Dynamic MIG", its commands as written
    there (a command after ``--`` instead of its demo image): one A100-40GB in MIG mode whose
    partitions may serve shares, a project of 2 GPUs; ``mig1 --gpu-memory 10GB`` and ``mig2``,
    ``mig3 --mig-profile 2g.10gb`` each get a partition; an interactive ``--mig-profile 3g.20gb``
    then preempts a training job and runs on the room it freed."""
    s = MigServer(tmp_path, native, FAKE_GPU_DEVICES=A100_40, TESSERA_MIG_SERVES_SHARES="true")
    with s.serving("team-a", gpu="2"), s.http() as client:
        for name, *flags in (("mig1", "--gpu-memory", "10GB"),
                             ("mig2", "--mig-profile", "2g.10gb"),
                             ("mig3", "--mig-profile", "2g.10gb")):
            r = s.cli("submit", name, "-p", "team-a", *flags, "--", *HOLD, check=False)
            assert r.returncode == 0, r.stderr
        running = {n: s.wait_for(client, n, "Running") for n in ("mig1", "mig2", "mig3")}
        assert "served by MIG 1g.10gb" in running["mig1"]["phaseMessage"], running["mig1"]
        for n in ("mig2", "mig3"):
            assert running[n]["phaseMessage"].startswith("MIG 2g.10gb"), running[n]
        r = s.cli("submit", "mig1-int", "-p", "team-a", "--interactive", "--mig-profile",
                  "3g.20gb", "--", *HOLD, check=False)
        assert r.returncode == 0, r.stderr
        wid = next(w["workloadId"] for w in client.get("/api/v1/workloads").json()["workloads"]
                   if w["name"] == "mig1-int")
        interactive = s.wait_phase(client, "workspaces", wid, "Running")
        assert interactive["phaseMessage"].startswith("MIG 3g.20gb"), interactive
        docs = {n: s.workload(client, n) for n in ("mig1", "mig2", "mig3")}
        preempted = [n for n, d in docs.items() if any(
            e["kind"] == "Preempted" and e["message"].startswith("preempted by mig1-int")
            for e in d["events"])]
        assert preempted and all(docs[n]["phase"] == "Pending" for n in preempted), docs

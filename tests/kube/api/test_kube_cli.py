"""The CLI walkthroughs against the Kubernetes backend: the real ``tessera`` CLI talks to the real
REST API server (``python -m tessera.kube.api_server``), which drives the real API server;
tessera-scheduler (started by the harness hook) places the pods on kwok GPU nodes.

The walkthrough is the embedded one (tests/cli/test_cli_walkthrough.py) on a private node of a
model no other test uses (1 x A100-80GB, asked for with --gpu-model), so that "same GPU" and
"waits for room" do not depend on what other tests left on the shared nodes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Namespace, Node, Pod
from lightkube.types import PatchType

from tessera.kube import names
from tessera.kube.objects import PodGroupResource, ProjectResource
from tessera.testing.cluster import ManagedProcess, TestCluster, start_scheduler
from tessera.testing.gpu_nodes import NodeShape
from tessera.testing.kube_api import KubeApiServer
from tessera.testing.kwok_io import cri_log, start_io_nodes
from tests.shares import share
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
LOOP = "import time; [time.sleep(1) for _ in iter(int, 1)]"
MODEL = "A100-80GB"
IO_MODEL = "H200-141GB"
A100_BYTES = 81920 * 2**20




@pytest.fixture(scope="module")
def server(kube_cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[KubeApiServer]:
    before = list(kube_cluster.processes)
    scheduler = start_scheduler(kube_cluster)
    assert scheduler is not None, "tessera.kube.scheduler is missing"
    started: list[ManagedProcess] = [p for p in kube_cluster.processes if p not in before]
    kube_cluster.create_gpu_nodes(1, NodeShape(gpus=1, model=MODEL), prefix="cli-a100-")
    # The API server runs as its ServiceAccount with exactly deploy/api-rbac.yaml's rules.
    kube_cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "api-rbac.yaml"))
    kubeconfig = kube_cluster.service_account_kubeconfig(names.SYSTEM_NAMESPACE, "tessera-api")
    s = KubeApiServer(tmp_path_factory.mktemp("kube-cli"), kubeconfig)
    s.start()
    try:
        yield s
    finally:
        s.cleanup()
        # The hook's processes would otherwise outlive this module and hold the leader Lease.
        for p in reversed(started):
            p.stop()
            kube_cluster.processes.remove(p)


def _wait(server: KubeApiServer, *names_: str, status: str = "Running", project: str = "") -> None:
    extra = ["-p", project] if project else []
    server.cli("wait", *names_, *extra, "--for", status, "--timeout", "30")


def test_walkthrough_on_kubernetes(server: KubeApiServer, kube_client: Client) -> None:
    """runai project set team-a; submit frac05 -g 0.5 and frac03 -g 0.3; same GPU; top; a 20G
    job waits (why pending) until frac03 is deleted."""
    assert "(kubernetes)" in server.cli("login").stdout
    assert json.loads(server.config.read_text())["backend"] == "kubernetes"
    server.cli("project", "create", "cli-team-a", "--gpu", "1")
    server.cli("project", "set", "cli-team-a")
    project = kube_client.get(ProjectResource, "cli-team-a")
    assert project["spec"]["namespace"] == "cli-team-a"
    assert project["spec"]["resources"]["gpu"]["deserved"] == 1
    kube_client.get(Namespace, "cli-team-a")
    model = ["--gpu-model", MODEL]
    server.cli("submit", "frac05", "-g", "0.5", "--interactive", *model, "--",
               "python3", "-c", LOOP)
    server.cli("submit", "frac03", "-g", "0.3", "--interactive", *model, "--",
               "python3", "-c", LOOP)
    _wait(server, "frac05", "frac03")

    pod = kube_client.get(Pod, "frac05-0", namespace="cli-team-a")
    assert pod.spec is not None and pod.metadata is not None
    ann = pod.metadata.annotations or {}
    assert pod.spec.schedulerName == "tessera"
    assert ann[names.GPU_PORTION] == "0.5" and ann[names.GPU_MODEL] == MODEL
    assert ann[names.POD_GROUP] == "frac05" and ann[names.PRIORITY_CLASS] == "build"
    assert pod.spec.containers[0].command == ["python3", "-c", LOOP]
    assert pod.spec.containers[0].image == "busybox:1.36"
    assert pod.spec.containers[0].workingDir is None  # not the CLI's directory

    table = server.cli("list").stdout
    assert "SIMULATED" in table.splitlines()[0]
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:]}
    assert rows["frac05"][1] == "Running" and rows["frac03"][1] == "Running"
    assert "0.50 (0.50)" in table and "0.30 (0.30)" in table
    listed = {w["name"]: w for w in server.cli_json("list")["workloads"]}
    assert listed["frac05"]["nodeName"] == listed["frac03"]["nodeName"]
    assert listed["frac05"]["nodeName"].startswith("cli-a100-")
    assert listed["frac05"]["gpuDevices"] == listed["frac03"]["gpuDevices"] == "0"

    d = server.cli_json("describe", "frac05")
    node = kube_client.get(Node, listed["frac05"]["nodeName"])
    assert node.metadata is not None and node.metadata.annotations is not None
    uuid = node.metadata.annotations[names.NODE_GPU_UUIDS].split(",")[0]
    dev = d["pods"][0]["gpuDevices"][0]
    assert dev["uuid"] == uuid and dev["requestBytes"] == share(0.5, "A100-80GB", A100_BYTES)
    assert d["pods"][0]["configMap"] == "frac05-0-tessera-gpu"
    assert d["type"] == "Workspace" and d["preemptible"] is False
    described = server.cli("describe", "frac05").stdout
    assert "cli-team-a/frac05-0 on cli-a100-" in described and "Submitted" in described

    top = server.cli("top").stdout
    assert "frac05" in top and "frac03" in top and "80%" in top

    server.cli("submit", "mem20g", "--gpu-memory", "20G", *model, "--", "python3", "-c", LOOP)
    try:
        described = wait_until("why pending", lambda: (
            out if "with 18.6 GiB free" in (out := server.cli("describe", "mem20g").stdout) else None))
    except AssertionError:
        raise AssertionError(server.cli("describe", "mem20g").stdout) from None
    assert "Status:      Pending" in described and "Why pending: " in described
    server.cli("delete", "frac03")
    _wait(server, "mem20g")
    d = server.cli_json("describe", "mem20g")
    assert d["pods"][0]["gpuDevices"][0]["requestBytes"] == 20 * 10**9
    server.cli("delete", "frac05", "mem20g")
    wait_until("pods gone", lambda: not list(kube_client.list(Pod, namespace="cli-team-a")))
    assert server.cli_json("list")["total"] == 0


def test_logs_and_exec_say_why_on_kwok(server: KubeApiServer) -> None:
    """kwok nodes run no containers: the API server cannot reach a kubelet for pods/log or
    pods/exec; the CLI says so in one line and exits 1."""
    server.cli("project", "create", "cli-io", "--gpu", "1")
    server.cli("submit", "io", "-p", "cli-io", "-g", "0.1", "--gpu-model", MODEL, "--", "true")
    _wait(server, "io", project="cli-io")
    for args in (["logs", "io", "-p", "cli-io"], ["exec", "io", "-p", "cli-io", "--", "env"]):
        r = server.cli(*args, check=False)
        assert r.returncode == 1, (args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
        assert "could not reach the node's kubelet" in lines[0]
        assert "is simulated (kwok): no container runs there" in lines[0]
    with server.http() as http:
        wid = server.cli_json("describe", "io", "-p", "cli-io")["workloadId"]
        r = http.post(f"/api/v1/workloads/trainings/{wid}/exec", json={"command": ["env"]})
        assert r.status_code == 502 and "10250" in r.json()["message"]
        r = http.post(f"/api/v1/workloads/trainings/{wid}/exec", json={"command": []})
        assert r.status_code == 422 and r.json()["message"].startswith("command:")
    server.cli("delete", "io", "-p", "cli-io")


def test_gang_suspend_resume_and_requeue(server: KubeApiServer, kube_client: Client) -> None:
    server.cli("project", "create", "cli-gang", "--gpu", "1")
    p = ["-p", "cli-gang"]
    server.cli("training", "submit", "ddp", *p, "--workers", "3", "--min-workers", "2",
               "--gpu-portion-request", "0.1", "--gpu-portion-limit", "0.3", "--gpu-model",
               MODEL, "-e", "FOO=bar", "-i", "example.invalid/trainer:1", "--", "sleep", "600")
    _wait(server, "ddp", project="cli-gang")
    group = kube_client.get(PodGroupResource, "ddp", namespace="cli-gang")
    assert group["spec"] == {"minMember": 2, "project": "cli-gang", "priorityClassName": "train"}
    pods = {q.metadata.name: q for q in kube_client.list(Pod, namespace="cli-gang")
            if q.metadata is not None}
    assert sorted(pods) == ["ddp-0", "ddp-1", "ddp-2"]
    for q in pods.values():
        assert q.metadata is not None and q.spec is not None
        assert (q.metadata.annotations or {})[names.POD_GROUP] == "ddp"
        assert (q.metadata.annotations or {})[names.GPU_PORTION_LIMIT] == "0.3"
        env = {e.name: e.value for e in q.spec.containers[0].env or []}
        assert env["FOO"] == "bar" and env["TESSERA_WORKERS"] == "3"
        assert q.spec.containers[0].image == "example.invalid/trainer:1"
    d = server.cli_json("training", "describe", "ddp", *p)
    assert d["runningPods"] == 3 and d["minWorkers"] == 2
    assert d["pods"][1]["gpuDevices"][0]["limitBytes"] == share(0.3, "A100-80GB", A100_BYTES)

    # An evicted (deleted) pod is created again by the API's reconcile loop.
    kube_client.delete(Pod, "ddp-1", namespace="cli-gang")
    wait_until("ddp-1 requeued", lambda: any(
        e["kind"] == "Requeued" for e in server.cli_json("describe", "ddp", *p)["events"]))
    _wait(server, "ddp", project="cli-gang")

    server.cli("training", "suspend", "ddp", *p)
    _wait(server, "ddp", status="Stopped", project="cli-gang")
    assert not list(kube_client.list(Pod, namespace="cli-gang"))
    kube_client.get(PodGroupResource, "ddp", namespace="cli-gang")  # the record is kept
    r = server.cli("training", "suspend", "ddp", *p, check=False)
    assert r.returncode == 1 and "only Pending or Running suspend" in r.stderr
    server.cli("training", "resume", "ddp", *p)
    _wait(server, "ddp", project="cli-gang")
    assert len(list(kube_client.list(Pod, namespace="cli-gang"))) == 3
    kinds = [e["kind"] for e in server.cli_json("describe", "ddp", *p)["events"]]
    assert "Suspended" in kinds and "Resumed" in kinds
    server.cli("delete", "ddp", *p)
    with pytest.raises(ApiError):
        kube_client.get(PodGroupResource, "ddp", namespace="cli-gang")
    wait_until("pods gone", lambda: not list(kube_client.list(Pod, namespace="cli-gang")))


def test_bad_input_same_messages(server: KubeApiServer) -> None:
    """The refusals of embedded mode, with the same one-line messages and exit code 1."""
    server.cli("project", "create", "cli-bad", "--gpu", "1", "--limit", "2")
    cases = [
        (["submit", "x", "-p", "cli-bad", "-g", "1.5", "--", "true"], "-g:"),
        (["submit", "x", "-p", "cli-bad", "--gpu-portion-request", "0.5", "--gpu-portion-limit",
          "0.2", "--", "true"], "--gpu-portion-limit:"),
        (["submit", "x", "-p", "cli-bad", "--gpu-memory", "5X", "--", "true"], "--gpu-memory:"),
        (["submit", "x", "-p", "cli-bad", "--gpu-memory", "200G", "--", "true"],
         "--gpu-memory: is larger than every GPU in the cluster"),
        (["submit", "x", "-p", "cli-bad", "-g", "0.5", "--gpu-model", "V100-16GB", "--", "true"],
         "--gpu-model: no GPU of model V100-16GB in the cluster"),
        (["submit", "x", "-p", "cli-bad", "-g", "3", "--", "true"],
         "-g: asks 3 GPUs, more than project cli-bad's limit of 2"),
        (["submit", "x", "-p", "cli-bad", "-g", "0.5"], "COMMAND:"),
        (["submit", "x", "-p", "nope", "-g", "0.5", "--", "true"], "-p:"),
        (["submit", "X_bad", "-p", "cli-bad", "--", "true"], "NAME:"),
        (["describe", "ghost", "-p", "cli-bad"], "no workload ghost"),
        (["project", "create", "cli-bad"], "project cli-bad already exists"),
        (["project", "create", "Bad_Name"], "NAME: must be lowercase letters"),
        (["submit", "x", "-p", "cli-bad", "--gpu-mig-profile", "3g.20gb", "--", "true"],
         "--gpu-mig-profile: no GPU in MIG mode on this cluster (MIG mode is an operator's "
         "choice"),
    ]
    for args, needle in cases:
        r = server.cli(*args, check=False)
        assert r.returncode == 1, (args, r.returncode, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], (
            args, r.stderr)
    assert server.cli_json("list", "-p", "cli-bad")["total"] == 0
    with server.http() as http:
        r = http.post("/api/v1/workloads/trainings", json={
            "name": "x", "projectId": "cli-bad",
            "spec": {"command": "true", "compute": {"gpuPortionRequest": 1.5}}})
        assert r.status_code == 422
        assert r.json()["message"].startswith("spec.compute.gpuPortionRequest:")
    server.cli("submit", "dup", "-p", "cli-bad", "-g", "0.1", "--gpu-model", MODEL, "--",
               "sleep", "600")
    r = server.cli("submit", "dup", "-p", "cli-bad", "-g", "0.1", "--", "true", check=False)
    assert r.returncode == 1 and "a workload named dup already exists in project cli-bad" in r.stderr
    r = server.cli("project", "delete", "cli-bad", check=False)
    assert r.returncode == 1 and "has 1 workload(s)" in r.stderr
    server.cli("delete", "dup", "-p", "cli-bad")


def test_projects_are_project_objects(server: KubeApiServer, kube_client: Client) -> None:
    server.cli("project", "create", "cli-proj", "--gpu", "2", "--limit", "4",
               "--over-quota-weight", "3", "--priority", "70")
    listed = {p["name"]: p for p in server.cli_json("project", "list")["projects"]}
    gpu = listed["cli-proj"]["resources"]["gpu"]
    assert gpu == {"deserved": 2.0, "limit": 4.0, "overQuotaWeight": 3.0}
    assert listed["cli-proj"]["priority"] == 70
    server.cli("project", "update", "cli-proj", "--gpu", "1")  # only deserved changes (PATCH)
    obj = kube_client.get(ProjectResource, "cli-proj")
    assert obj["spec"]["resources"]["gpu"] == {"deserved": 1, "limit": 4, "overQuotaWeight": 3}
    assert obj["spec"]["priority"] == 70
    server.cli("project", "delete", "cli-proj")
    with pytest.raises(ApiError):
        kube_client.get(ProjectResource, "cli-proj")
    ns = kube_client.get(Namespace, "cli-proj")  # no namespace controller here: Terminating
    assert ns.metadata is not None and ns.metadata.deletionTimestamp is not None
    assert "cli-proj" not in json.dumps(server.cli_json("project", "list"))


def test_up_kubernetes_via_cli(server: KubeApiServer, kube_cluster: TestCluster,
                               tmp_path: Path) -> None:
    """``tessera up --kubernetes --kubeconfig`` starts the API server for the cluster, logs the CLI
    in, and ``tessera down`` stops it."""
    from tessera.testing.embedded import EmbeddedServer, free_port

    other = EmbeddedServer(tmp_path, port=free_port())
    port = str(other.port)
    r = other.cli("up", "--kubernetes", "--kubeconfig", str(kube_cluster.kubeconfig),
                  "--port", port, "--detach", "--data-dir", str(tmp_path / "kdata"))
    try:
        assert "Kubernetes backend" in r.stdout
        config = json.loads(other.config.read_text())
        assert config["backend"] == "kubernetes" and config["url"].endswith(port)
        assert "cli-a100-" in other.cli("top").stdout
        r = other.cli("up", "--kubeconfig", "x", check=False)
        assert r.returncode == 1 and "needs --kubernetes" in r.stderr
    finally:
        other.cli("down", "--data-dir", str(tmp_path / "kdata"))


def test_exit_code_and_on_eviction_fail(server: KubeApiServer, kube_client: Client) -> None:
    """A pod that failed gives the workload its exit code (kwok runs nothing, so the test writes
    the status a kubelet would); a workload submitted with --on-eviction fail is Failed, not
    requeued, when its pod is evicted (deleted)."""
    server.cli("project", "create", "cli-end", "--gpu", "1")
    p = ["-p", "cli-end"]
    server.cli("submit", "crash", *p, "-g", "0.1", "--gpu-model", MODEL, "--", "false")
    server.cli("submit", "strict", *p, "-g", "0.1", "--gpu-model", MODEL, "--on-eviction",
               "fail", "--", "sleep", "600")
    _wait(server, "crash", "strict", project="cli-end")
    kube_client.patch(Pod.Status, "crash-0", {"status": {"phase": "Failed", "containerStatuses": [{
        "name": "main", "image": "busybox:1.36", "imageID": "", "ready": False,
        "restartCount": 0, "state": {"terminated": {"exitCode": 7, "reason": "Error"}}}]}},
        namespace="cli-end", patch_type=PatchType.MERGE)
    server.cli("wait", "crash", *p, "--for", "Failed", "--timeout", "30")
    d = server.cli_json("describe", "crash", *p)
    assert d["exitCode"] == 7 and d["phaseMessage"] == "pod 0 failed with exit code 7"
    assert "Status:      Failed (exit code 7)" in server.cli("describe", "crash", *p).stdout

    kube_client.delete(Pod, "strict-0", namespace="cli-end")
    server.cli("wait", "strict", *p, "--for", "Failed", "--timeout", "30")
    d = server.cli_json("describe", "strict", *p)
    assert "onEviction: fail" in d["phaseMessage"] and d["pods"] == []
    time.sleep(1.0)  # a few reconcile rounds: neither is created again
    assert [q.metadata.name for q in kube_client.list(Pod, namespace="cli-end")
            if q.metadata is not None] == ["crash-0"]
    server.cli("delete", "crash", "strict", *p)


def test_manifest_pods_are_listed(server: KubeApiServer, kube_client: Client) -> None:
    """Pods applied with kubectl (tessera.io annotations, schedulerName tessera) show in list
    and describe; tessera deletes a bare pod but not a controller's, and does not suspend them."""
    from lightkube.models.core_v1 import Container, PodSpec
    from lightkube.models.meta_v1 import ObjectMeta, OwnerReference

    server.cli("project", "create", "cli-yaml", "--gpu", "1")

    def pod(name: str, owner: bool = False) -> Pod:
        refs = [OwnerReference(apiVersion="apps/v1", kind="StatefulSet", name="binpack-1",
                               uid="0c4f6a52-0000-4000-8000-000000000001", controller=True)]
        return Pod(metadata=ObjectMeta(name=name, namespace="cli-yaml", annotations={
            names.GPU_PORTION: "0.25", names.GPU_MODEL: MODEL},
            ownerReferences=refs if owner else None),
            spec=PodSpec(schedulerName="tessera", containers=[Container(
                name="main", image="example.invalid/cuda:12", command=["sleep", "inf"])]))

    kube_client.create(pod("raw"))
    kube_client.create(pod("binpack-1-0", owner=True))
    server.cli("wait", "raw", "binpack-1-0", "-p", "cli-yaml", "--timeout", "30")
    listed = {w["name"]: w for w in server.cli_json("list", "-p", "cli-yaml")["workloads"]}
    assert set(listed) == {"raw", "binpack-1-0"}
    assert listed["raw"]["gpus"]["allocated"] == 0.25
    d = server.cli_json("describe", "raw", "-p", "cli-yaml")
    assert d["source"] == "manifest" and d["spec"]["command"] == "sleep"
    assert d["pods"][0]["gpuDevices"][0]["requestBytes"] == share(0.25, "A100-80GB", A100_BYTES)
    r = server.cli("suspend", "raw", "-p", "cli-yaml", check=False)
    assert r.returncode == 1 and "applied as Kubernetes objects" in r.stderr
    r = server.cli("delete", "binpack-1-0", "-p", "cli-yaml", check=False)
    assert r.returncode == 1 and "belong to StatefulSet/binpack-1" in r.stderr
    server.cli("delete", "raw", "-p", "cli-yaml")
    wait_until("raw gone", lambda: [w["name"] for w in server.cli_json(
        "list", "-p", "cli-yaml")["workloads"]] == ["binpack-1-0"])
    kube_client.delete(Pod, "binpack-1-0", namespace="cli-yaml")


def test_logs_and_exec_through_the_api_server(server: KubeApiServer, kube_cluster: TestCluster,
                                              kube_client: Client) -> None:
    """On nodes whose kubelet API answers (a second kwok with ClusterLogs/ClusterExec, which
    runs the command as a local process), ``logs`` reads pods/log and ``exec`` speaks the
    WebSocket exec protocol through the real API server: output, stderr and exit status."""
    assert kube_cluster.workdir is not None
    log_file = kube_cluster.workdir / "cli-io-pod.log"
    log_file.write_text(cri_log([("stdout", "hello from tessera"), ("stderr", "second line")]))
    proc = start_io_nodes(kube_cluster, ["cli-io-node-0"], NodeShape(gpus=1, model=IO_MODEL),
                          log_file)
    try:
        server.cli("project", "create", "cli-exec", "--gpu", "1")
        p = ["-p", "cli-exec"]
        server.cli("submit", "talk", *p, "-g", "0.5", "--gpu-model", IO_MODEL, "--",
                   "sleep", "600")
        _wait(server, "talk", project="cli-exec")
        assert server.cli("logs", "talk", *p).stdout == "hello from tessera\nsecond line\n"
        r = server.cli("exec", "talk", *p, "--", "sh", "-c",
                       "echo out; echo err >&2; echo kwok-exec=$KWOK_EXEC", check=False)
        assert (r.returncode, r.stdout, r.stderr) == (0, "out\nkwok-exec=yes\n", "err\n")
        with server.http() as http:
            wid = server.cli_json("describe", "talk", *p)["workloadId"]
            r2 = http.post(f"/api/v1/workloads/trainings/{wid}/exec",
                           json={"command": ["sh", "-c", "printf '%s' \"$0\"", "a b"]})
            assert r2.status_code == 200 and r2.json() == {
                "exitCode": 0, "stdout": "a b", "stderr": ""}  # argv kept as given
        server.cli("delete", "talk", *p)
        wait_until("talk gone", lambda: not list(kube_client.list(Pod, namespace="cli-exec")))
    finally:
        proc.stop()
        kube_cluster.processes.remove(proc)
        # Without its kwok the node would stay NotReady but schedulable: remove it.
        kube_client.delete(Node, "cli-io-node-0")


def test_pod_name_taken_is_409_and_nothing_left(server: KubeApiServer, kube_client: Client
                                                ) -> None:
    """A submit whose pod name is taken by someone else's pod is refused and leaves nothing."""
    from lightkube.models.core_v1 import Container, PodSpec
    from lightkube.models.meta_v1 import ObjectMeta

    server.cli("project", "create", "cli-taken", "--gpu", "1")
    kube_client.create(Pod(metadata=ObjectMeta(name="job-1", namespace="cli-taken"),
                           spec=PodSpec(containers=[Container(name="c", image="x")])))
    r = server.cli("submit", "job", "-p", "cli-taken", "--workers", "2", "-g", "0.1",
                   "--gpu-model", MODEL, "--", "true", check=False)
    assert r.returncode == 1
    assert "a pod named cli-taken/job-1 already exists (not this workload's)" in r.stderr
    assert not list(kube_client.list(PodGroupResource, namespace="cli-taken"))
    wait_until("only job-1 left", lambda: [q.metadata.name for q in kube_client.list(
        Pod, namespace="cli-taken") if q.metadata is not None] == ["job-1"], timeout=10)
    kube_client.delete(Pod, "job-1", namespace="cli-taken")


def test_submit_through_the_admission_webhook(server: KubeApiServer, kube_cluster: TestCluster,
                                              kube_client: Client) -> None:
    """With tessera-webhook registered, a submitted pod is admitted and wired to its ConfigMap
    (the canonical annotations are what the webhook expects); a pod the webhook refuses is a
    one-line 422 naming the field, and nothing is left behind."""
    from lightkube.resources.core_v1 import ConfigMap

    from tessera.testing import webhook as local
    from tests.kube.admission_helpers import wait_webhook_sees_project

    # The harness hook runs the scheduler with the admin certificate (user tessera-admin): tell
    # the webhook that this is the scheduler, the only writer of per-pod ConfigMaps.
    hook = local.start_webhook(kube_cluster, name="cli-webhook",
                               extra_args=["--scheduler-user", "tessera-admin"])
    try:
        local.register(kube_cluster, hook)
        server.cli("project", "create", "cli-hook", "--gpu", "1")
        wait_webhook_sees_project(kube_client, "cli-hook")
        p = ["-p", "cli-hook"]
        server.cli("submit", "hooked", *p, "-g", "0.5", "--gpu-model", MODEL, "--",
                   "python3", "train.py")
        _wait(server, "hooked", project="cli-hook")
        pod = kube_client.get(Pod, "hooked-0", namespace="cli-hook")
        assert pod.spec is not None
        assert pod.spec.containers[0].workingDir is None  # not the CLI's directory
        refs = {e.name: e.valueFrom.configMapKeyRef.name for e in pod.spec.containers[0].env or []
                if e.valueFrom is not None and e.valueFrom.configMapKeyRef is not None}
        assert refs["NVIDIA_VISIBLE_DEVICES"] == "hooked-0-tessera-gpu"
        data = kube_client.get(ConfigMap, "hooked-0-tessera-gpu", namespace="cli-hook").data or {}
        uuid = server.cli_json("describe", "hooked", *p)["pods"][0]["gpuDevices"][0]["uuid"]
        assert data["NVIDIA_VISIBLE_DEVICES"] == uuid

        r = server.cli("submit", "sneaky", *p, "-g", "0.1", "-e", "NVIDIA_VISIBLE_DEVICES=GPU-1",
                       "--", "true", check=False)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1, r.stderr
        assert "the API server refused pod cli-hook/sneaky-0" in lines[0]
        assert "NVIDIA_VISIBLE_DEVICES" in lines[0]
        assert [w["name"] for w in server.cli_json("list", *p)["workloads"]] == ["hooked"]
        server.cli("delete", "hooked", *p)
        wait_until("pods gone", lambda: not list(kube_client.list(Pod, namespace="cli-hook")))
    finally:
        local.unregister(kube_cluster)
        hook.stop()


def test_whole_gpus_use_the_device_plugin_resource(server: KubeApiServer,
                                                   kube_client: Client) -> None:
    server.cli("project", "create", "cli-whole", "--gpu", "2")
    p = ["-p", "cli-whole"]
    server.cli("submit", "big", *p, "-g", "2", "--gpu-model", "H100-80GB", "--", "sleep", "1")
    _wait(server, "big", project="cli-whole")
    pod = kube_client.get(Pod, "big-0", namespace="cli-whole")
    assert pod.spec is not None and pod.metadata is not None
    resources = pod.spec.containers[0].resources
    assert resources is not None and resources.limits == {names.GPU_RESOURCE: "2"}
    assert names.GPU_PORTION not in (pod.metadata.annotations or {})
    d = server.cli_json("describe", "big", *p)
    assert d["pods"][0]["exclusive"] is True and len(d["pods"][0]["gpuDevices"]) == 2
    assert d["gpus"]["allocated"] == 2.0 and d["gpus"]["requested"] == 2.0
    assert "(UUID chosen by the device plugin): whole device" in server.cli(
        "describe", "big", *p).stdout
    top = server.cli("top").stdout
    assert top.count("big (whole)") == 2
    server.cli("delete", "big", *p)


def test_pending_time_runs_from_the_last_transition_to_pending(server: KubeApiServer) -> None:
    """Kubernetes too (issue 34): a resumed workload's wait is timed from its resume (the new
    pods' creation) to its binding (PodScheduled's transition), not from its submission; the
    workload document says both, and ``tessera_workload_pending_seconds`` observes the short
    second wait, not the first run."""
    from prometheus_client.parser import text_string_to_metric_families

    def pending() -> tuple[float, float]:
        with server.http() as http:
            text = http.get("/metrics", timeout=10).text
        got = {s.name: s.value for f in text_string_to_metric_families(text)
               if f.name == "tessera_workload_pending_seconds" for s in f.samples
               if s.labels.get("type") == "Training" and not s.name.endswith("_bucket")}
        return (got.get("tessera_workload_pending_seconds_count", 0.0),
                got.get("tessera_workload_pending_seconds_sum", 0.0))

    server.cli("project", "create", "cli-pend", "--gpu", "1")
    p = ["-p", "cli-pend"]
    pending()  # the collector's watermark: starts after this are observed
    time.sleep(1.1)
    server.cli("training", "submit", "pw", *p, "-g", "0.2", "--gpu-model", MODEL, "--",
               "sleep", "600")
    _wait(server, "pw", project="cli-pend")
    first = server.cli_json("describe", "pw", *p)
    assert first["createdAt"] <= first["pendingSince"] <= first["startedAt"]
    count, total = wait_until("the first start observed", lambda: (
        x if (x := pending())[0] >= 1 else None))
    time.sleep(5)  # it runs a while, then is stopped and resumed
    server.cli("training", "suspend", "pw", *p)
    _wait(server, "pw", status="Stopped", project="cli-pend")
    time.sleep(1.5)
    server.cli("training", "resume", "pw", *p)
    _wait(server, "pw", project="cli-pend")
    again = server.cli_json("describe", "pw", *p)
    assert again["createdAt"] == first["createdAt"]
    assert again["pendingSince"] > first["startedAt"]  # the resume, after the first run began
    assert again["pendingSince"] <= again["startedAt"]
    _, total2 = wait_until("the second start observed", lambda: (
        x if (x := pending())[0] >= count + 1 else None))
    # the second wait: from the resume to the binding (seconds), not from submission (> 6 s)
    assert total2 - total < 5, (total, total2, again)
    server.cli("delete", "pw", *p)

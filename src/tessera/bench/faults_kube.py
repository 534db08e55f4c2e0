"""Fault suite on Kubernetes: kill -9 tessera-scheduler while it binds GPU shares, restart it,
and check that no GPU is over-committed and every pod ends placed or explained.

``python -m tessera.bench.faults_kube [--trials 100] [--pods 12] [--seed 1]``

One test cluster (real etcd + kube-apiserver, kwok nodes, one tessera-node per node on the fake
driver: ``tessera.testing.cluster``) with 2 nodes of 4 x A100-40GB, a Project and the real
``tessera-scheduler`` running as its ServiceAccount with the rules of deploy/rbac.yaml. Each
trial creates ``--pods`` pods asking for a quarter or half of a GPU, kills the scheduler with
SIGKILL at a random moment while it binds them (after 0 to all-but-one are bound), starts it
again, waits until every pod is bound or marked unschedulable, and checks:

1. no device over-committed: the bytes of all bound pods' placements on each GPU UUID are within
   the device's memory (40 GiB);
2. nothing duplicated or lost: each GPU is held by at most one reservation pod, and every bound
   pod's ConfigMap names the devices of its placement;
3. every pod placed or explained (bound, or PodScheduled=False with a reason).

The pods are then deleted and the next trial starts.

Other faults, the same trial and checks (``--scenarios``):

* ``apiserver``: kube-apiserver itself is killed with SIGKILL 0-0.3 s after the trial's pods
  are created, while the scheduler binds them, down for 0-3 s, and started again on the same etcd (``TestCluster.restart_apiserver``): the
  scheduler's watches and writes recover by themselves (or, if it exited, it is started again
  as its Deployment would; counted);
* ``node-agent``: the tessera-node of one node is killed with SIGKILL while shares are bound
  on it, some pods are deleted while it is down, and it is started again after 0-2 s. On top
  of the checks above: it resumes (the Node is ready for shares again), every bound share pod
  on that node has its isolation file, and once the trial's pods are deleted no pod's files
  are left on any node (no leaked files);
* ``webhook``: kill -9 of tessera-webhook while GPU pods are created (below).

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
DEVICE_BYTES = 40960 * 2**20


def _wait(check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


class Env:
    def __init__(self, cluster: Any) -> None:
        from tessera.kube import names

        self.cluster = cluster
        self.client = cluster.client()
        cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "crds"))
        cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "rbac.yaml"))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                        "crd/projects.tessera.io", "crd/podgroups.tessera.io")
        self.kubeconfig = cluster.service_account_kubeconfig(names.SYSTEM_NAMESPACE,
                                                             "tessera-scheduler")
        self.log = cluster.workdir / "logs" / "faults-scheduler.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        """Times the scheduler exited by itself and was started again (supervise)."""
        self.agents: dict[str, Any] = {n: a for group in cluster.node_agents
                                       for n, a in group.agents.items()}

    def start_scheduler(self) -> None:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tessera.kube.scheduler", f"--kubeconfig={self.kubeconfig}",
             "--lease-duration=15", "--identity=faults"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def supervise(self) -> None:
        """Start the scheduler again if it stopped by itself (it exits when it cannot renew
        its lease, as on an overloaded machine), as its Deployment would."""
        if self.proc is not None and self.proc.poll() is not None:
            self.restarts += 1
            self.start_scheduler()

    def kill_scheduler(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            if self.proc.poll() is None:
                self.proc.kill()


def _pods(client: Any, ns: str) -> list[Any]:
    from lightkube.resources.core_v1 import Pod

    return list(client.list(Pod, namespace=ns))


def _settled(pod: Any) -> bool:
    if pod.spec and pod.spec.nodeName:
        return True
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason
               for c in (pod.status.conditions or []) if pod.status)


def check(client: Any, ns: str) -> list[str]:
    from lightkube.resources.core_v1 import ConfigMap, Pod

    from tessera.kube import names

    problems: list[str] = []
    per_uuid: dict[str, int] = {}
    pods = _pods(client, ns)
    for p in pods:
        if not _settled(p):
            problems.append(f"pod {p.metadata.name} neither bound nor explained")
        if not (p.spec and p.spec.nodeName):
            continue
        ann = p.metadata.annotations or {}
        placement = json.loads(ann.get(names.PLACEMENT, "{}"))
        uuids = [u for u in ann.get(names.NODE_GPU_UUIDS, "").split(",") if u]
        if not placement or len(uuids) != len(placement.get("request", [])):
            problems.append(f"pod {p.metadata.name} bound without a whole placement")
            continue
        for u, b in zip(uuids, placement["request"], strict=True):
            per_uuid[u] = per_uuid.get(u, 0) + int(b)
        try:
            cm = client.get(ConfigMap, f"{p.metadata.name}-tessera-gpu", namespace=ns)
            if (cm.data or {}).get("NVIDIA_VISIBLE_DEVICES") != ",".join(uuids):
                problems.append(f"pod {p.metadata.name}: ConfigMap disagrees with its placement")
        except Exception as exc:
            problems.append(f"pod {p.metadata.name}: no ConfigMap ({exc})")
    for u, b in per_uuid.items():
        if b > DEVICE_BYTES:
            problems.append(f"GPU {u} over-committed: {b} bytes")
    holders: dict[str, int] = {}
    for r in client.list(Pod, namespace=names.SYSTEM_NAMESPACE,
                         labels={names.RESERVATION_LABEL: "true"}):
        u = (r.metadata.annotations or {}).get(names.GPU_UUID)
        if u:
            holders[u] = holders.get(u, 0) + 1
    if any(n > 1 for n in holders.values()):
        problems.append(f"a GPU held by two reservation pods: {holders}")
    return problems


def _share_pod(name: str, ns: str, portion: str, key: str) -> dict[str, Any]:
    """A share pod as the webhook leaves it: the share, and the key and hostPath of the
    directory tessera-node writes its isolation file into (tessera.kube.admission.mutate)."""
    from tessera.kube import names

    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "annotations": {
                names.GPU_PORTION: portion, names.GPU_MODEL: "A100-40GB",
                names.GPU_CONFIG_KEY: key}},
            "spec": {"schedulerName": names.SCHEDULER_NAME,
                     "containers": [{"name": "main", "image": "example.invalid/cuda:12"}],
                     "volumes": [{"name": "tessera-gpu-config", "hostPath": {
                         "path": f"/var/lib/tessera/containers/{key}/conf/main",
                         "type": "Directory"}}]}}


def _conf(agent: Any, key: str) -> Any:
    return agent.containers_dir / key / "conf" / "main" / "gpu-isolation.conf"


def _agent_problems(env: Env, ns: str, node: str) -> list[str]:
    """After a node agent's restart: it is ready again and every bound share pod on its node
    has its isolation file."""
    from lightkube.resources.core_v1 import Node

    from tessera.kube import names

    agent = env.agents[node]
    problems: list[str] = []

    def caught_up() -> bool:
        return all(_conf(agent, (p.metadata.annotations or {})[names.GPU_CONFIG_KEY]).is_file()
                   for p in _pods(env.client, ns) if p.spec and p.spec.nodeName == node)

    if not _wait(caught_up, 30):
        problems.append(f"tessera-node on {node} did not write every bound pod's file")
    ready = (env.client.get(Node, node).metadata.annotations or {}).get(names.NODE_READY)
    if ready != "true":
        problems.append(f"{node} not ready for shares after the agent's restart ({ready})")
    return problems


def trial(env: Env, ns: str, index: int, pods: int, rng: random.Random,
          fault: str = "scheduler") -> dict[str, Any]:
    """One trial; ``fault``: scheduler | apiserver | node-agent (see the module's docstring)."""
    from lightkube import codecs
    from lightkube.resources.core_v1 import Pod

    client = env.client
    keys = {}
    for i in range(pods):
        keys[f"t{index}-{i}"] = f"{rng.getrandbits(64):016x}"
        client.create(codecs.from_dict(_share_pod(f"t{index}-{i}", ns, rng.choice(
            ("0.25", "0.25", "0.5")), keys[f"t{index}-{i}"])))
    target = rng.randint(0, pods - 1)

    def bound_enough() -> bool:
        env.supervise()
        return sum(1 for p in _pods(client, ns) if p.spec and p.spec.nodeName) >= target

    if fault == "apiserver":
        time.sleep(rng.uniform(0.0, 0.3))  # while the scheduler binds what was just created
    else:
        _wait(bound_enough, 30)
    restarts_before = env.restarts
    bound_at_kill = sum(1 for p in _pods(client, ns) if p.spec and p.spec.nodeName)
    victim = ""
    if fault == "scheduler":
        env.kill_scheduler()
    elif fault == "apiserver":
        env.cluster.restart_apiserver(kill=True, down_seconds=rng.uniform(0.0, 3.0))
    elif fault == "node-agent":
        victim = rng.choice(sorted(env.agents))
        env.agents[victim].kill9()
    if fault == "scheduler":
        env.start_scheduler()
    elif fault == "node-agent":
        # Pods come and go while the agent is down: one bound on its node is deleted.
        gone = [p for p in _pods(client, ns) if p.spec and p.spec.nodeName == victim][:1]
        for p in gone:
            client.delete(Pod, p.metadata.name, namespace=ns, grace_period=0)
        time.sleep(rng.uniform(0.0, 2.0))
        env.agents[victim].restart()

    def settled() -> bool:
        env.supervise()
        return all(_settled(p) for p in _pods(client, ns))

    _wait(settled, 90)
    problems = check(client, ns)
    if fault == "node-agent":
        problems += _agent_problems(env, ns, victim)
    for p in _pods(client, ns):
        with contextlib.suppress(Exception):
            client.delete(Pod, p.metadata.name, namespace=ns, grace_period=0)
    _wait(lambda: not _pods(client, ns), 60)
    if env.agents:
        def no_files() -> bool:
            return not any(_conf(a, k).parent.parent.parent.exists()
                           for a in env.agents.values() for k in keys.values())

        if not _wait(no_files, 30):
            problems.append("isolation files of deleted pods left on a node (leaked)")
    return {"bound_at_kill": bound_at_kill, "problems": problems,
            "scheduler_restarts": env.restarts - restarts_before}


def webhook_trials(cluster: Any, client: Any, trials: int, rng: random.Random) -> dict[str, Any]:
    """kill -9 tessera-webhook while GPU pods are created, restart it on the same port: a GPU
    pod is either refused (the webhook fails closed) or stored with its isolation wiring
    (``policy.check_final`` on the pod as stored); never admitted unchecked."""
    import threading

    from lightkube import codecs
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Namespace, Pod

    from tessera.core.errors import InvalidRequest
    from tessera.core.model import GpuDevice, Node
    from tessera.kube import names
    from tessera.kube.admission import policy
    from tessera.kube.objects import ProjectResource
    from tessera.kube.podspec import containers_of, gpu_request
    from tessera.testing import webhook as local

    rbac = [d for d in local.helm_template() if d["kind"] in (
        "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
    cluster.service_account_kubeconfig(names.SYSTEM_NAMESPACE, "tessera-scheduler")
    kubeconfig = cluster.service_account_kubeconfig(names.SYSTEM_NAMESPACE, "tessera-webhook")
    local.apply(cluster, rbac)
    hook = local.start_webhook(cluster, kubeconfig=kubeconfig)
    local.register(cluster, hook)
    ns = "faults-webhook"
    client.create(Namespace(metadata=ObjectMeta(name=ns)))
    client.create(ProjectResource(metadata=ObjectMeta(name=ns), spec={
        "namespace": ns, "resources": {"gpu": {"deserved": 8}}}))
    shapes = [Node("n", tuple(GpuDevice(f"u{i}", i, DEVICE_BYTES, "A100-40GB")
                              for i in range(4)))]
    view = policy.ClusterView(nodes=lambda: shapes, project_of=lambda _n: ns)

    admitted = refused = unchecked = 0
    first = None
    seq = iter(range(10**9))
    try:
        time.sleep(2)  # the webhook's informers see the Project
        for t in range(trials):
            stop = threading.Event()
            created: list[str] = []
            counts = {"refused": 0}

            def creator(stop: threading.Event, created: list[str],
                        counts: dict[str, int]) -> None:
                while not stop.is_set():
                    name = f"w{next(seq)}"
                    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {
                        "name": name, "annotations": {"gpu-fraction": "0.5"}},
                        "spec": {"containers": [{"name": "main", "image": "x"}]}}
                    try:
                        client.create(codecs.from_dict(manifest), namespace=ns)
                        created.append(name)
                    except Exception:
                        counts["refused"] += 1

            th = threading.Thread(target=creator, args=(stop, created, counts))
            th.start()
            time.sleep(rng.uniform(0.05, 0.5))
            assert hook.process.popen is not None
            hook.process.popen.kill()
            hook.process.popen.wait()
            time.sleep(rng.uniform(0.0, 0.5))
            hook = local.start_webhook(cluster, kubeconfig=kubeconfig, port=hook.port)
            time.sleep(0.2)
            stop.set()
            th.join()
            refused += counts["refused"]
            for name in created:
                pod = client.get(Pod, name, namespace=ns).to_dict()
                try:
                    request = gpu_request((pod["metadata"].get("annotations") or {}),
                                          containers_of(pod["spec"]))
                    if request.kind.value not in ("portion", "memory"):
                        raise InvalidRequest("pod", "stored without its GPU share annotations")
                    policy.check_final(pod, ns, view, policy.WebhookConfig())
                    admitted += 1
                except InvalidRequest as exc:
                    unchecked += 1
                    first = first or f"trial {t}: pod {name}: {exc}"
            for name in created:
                with contextlib.suppress(Exception):
                    client.delete(Pod, name, namespace=ns, grace_period=0)
            print(f"webhook trial {t}: {len(created)} admitted, {counts['refused']} refused, "
                  f"{unchecked} unchecked so far", file=sys.stderr, flush=True)
    finally:
        local.unregister(cluster)
        hook.stop()
    return {"trials": trials, "kills": trials, "admitted": admitted, "refused": refused,
            "admitted_unchecked": unchecked, "failed_trials": 1 if unchecked else 0,
            "first_failure": first}


FAULTS = ("scheduler", "apiserver", "node-agent")


def setup(cluster: Any) -> tuple[Env, str]:
    """On a started test cluster: 2 nodes of 4 x A100-40GB with their tessera-node, tessera's
    CRDs and the scheduler's RBAC, a namespace and its Project. Returns (env, namespace)."""
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Namespace

    from tessera.kube.objects import ProjectResource
    from tessera.testing.gpu_nodes import NodeShape

    cluster.create_gpu_nodes(2, NodeShape(gpus=4, model="A100-40GB"), prefix="faults-")
    env = Env(cluster)
    ns = "faults"
    env.client.create(Namespace(metadata=ObjectMeta(name=ns)))
    env.client.create(ProjectResource(metadata=ObjectMeta(name=ns), spec={
        "namespace": ns, "resources": {"gpu": {"deserved": 8}}}))
    return env, ns


def run_fault(env: Env, ns: str, fault: str, trials: int, pods: int, rng: random.Random
              ) -> dict[str, Any]:
    """``trials`` trials of one fault with the scheduler running; the summary of them."""
    env.start_scheduler()
    failed, first, kills_at, restarts = 0, None, [], 0
    try:
        for i in range(trials):
            result = trial(env, ns, i, pods, rng, fault)
            kills_at.append(result["bound_at_kill"])
            restarts += result["scheduler_restarts"]
            if result["problems"]:
                failed += 1
                first = first or f"trial {i}: {result['problems'][0]}"
            print(f"{fault} trial {i}: killed with {result['bound_at_kill']} of {pods} bound, "
                  f"{'; '.join(result['problems']) or 'ok'}", file=sys.stderr, flush=True)
    finally:
        env.stop()
    return {"trials": trials, "kills": trials, "pods_per_trial": pods, "failed_trials": failed,
            "first_failure": first, "scheduler_exits_restarted": restarts,
            "bound_at_kill": {"min": min(kills_at, default=0), "max": max(kills_at, default=0)}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.bench.faults_kube")
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--pods", type=int, default=12)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scenarios", default="scheduler,apiserver,node-agent,webhook")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up servers and pods
    scenarios = args.scenarios.split(",")

    from tessera.testing.cluster import TestCluster

    rng = random.Random(args.seed)
    t0 = time.monotonic()
    cluster = TestCluster()
    cluster.start()
    env: Env | None = None
    try:
        env, ns = setup(cluster)
        summary: dict[str, Any] = {"bench": "faults_kube"}
        for fault in [s for s in scenarios if s in FAULTS]:
            summary[fault] = run_fault(env, ns, fault, args.trials, args.pods, rng)
        if "webhook" in scenarios:
            summary["webhook"] = webhook_trials(cluster, env.client, args.trials, rng)
        summary["seconds"] = round(time.monotonic() - t0, 1)
        summary["ok"] = all(summary[s]["failed_trials"] == 0 for s in scenarios)
    finally:
        if env is not None:
            env.stop()
        cluster.stop()
    print(json.dumps(summary))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""tessera-scheduler at scale on the test cluster (real etcd + kube-apiserver + kwok).

    python -m tessera.bench.kube [--nodes 500] [--gpus-per-node 8] [--whole 4000] [--half 4000]
                                 [--profile PATH]

500 kwok nodes × 8 H100 = 4,000 GPUs, so 4,000 one-GPU pods fill the cluster and 4,000 half-GPU
pods (2,000 GPUs) cannot run beside them. The benchmark therefore runs in phases on one cluster:

1. submit ``--whole`` one-GPU pods (project ``bulk``, deserved 0, preemptible ``train``) and time
   from the first create until every one is bound (the watch sees ``spec.nodeName``);
2. with those running (the cluster full), a pod of project ``starved`` (deserved 1 GPU) asks for
   one GPU: time until it is bound (the scheduler evicts one ``bulk`` pod and binds it);
3. delete the bulk pods (not timed), then submit ``--half`` half-GPU pods and time until all are
   bound (reservation pods, UUIDs from the kubelet double playing the agents, ConfigMaps, bindings).

``--claims``: the same pods ask through DRA instead (issue 19, docs/dra.md): each pod names its
own ResourceClaim (class ``gpu.tessera.io`` for one GPU, ``share.gpu.tessera.io`` with
``shares: 50`` for half of one), created just before it in the timed window; the scheduler
writes each claim's allocation before binding. ``--claims-ahead``: the claims are created
before the timed window, so only the pods and the scheduler are timed.

Pods are submitted by 32 concurrent creates. The scheduler and the kubelet double (--play-agents)
run as their own processes, as in a cluster. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import msgspec
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod

from tessera.bench.kube_cpu import CpuMeter
from tessera.bench.kube_pods import bodies, claim_body, claim_pod_body, kind_of, pod
from tessera.kube import names
from tessera.kube.objects import ProjectResource
from tessera.kube.rawapi import KubeHTTPError, RawApi
from tessera.testing.cluster import TestCluster
from tessera.testing.gpu_nodes import NodeShape
from tessera.testing.processes import stop_processes

ROOT = Path(__file__).resolve().parents[3]
_encode = msgspec.json.Encoder().encode


async def _submit(raw: RawApi, bodies: list[tuple[str, Any]], concurrency: int = 32) -> float:
    """Create the objects (path, body; claims before their pods), ``concurrency`` at a time,
    through the lean client (so the load generator's own CPU stays small next to the
    scheduler's on a 2-core machine); a created object's reply is read, not decoded."""
    it = iter(bodies)

    async def worker() -> None:
        for path, body in it:
            for attempt in range(5):
                try:
                    await raw.request("POST", path, body, decode=False)
                    break
                except KubeHTTPError as exc:
                    if exc.code == 409 or attempt == 4:
                        raise
                    await asyncio.sleep(0.2)

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.monotonic() - t0


class _Meta(msgspec.Struct):
    name: str = ""


class _Spec(msgspec.Struct):
    nodeName: str = ""


class _PodSeen(msgspec.Struct):
    """The two fields of a pod the waiter reads; the rest of each event is skipped undecoded."""
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _Spec = msgspec.field(default_factory=_Spec)


class _Event(msgspec.Struct):
    type: str
    object: _PodSeen


class _ListMeta(msgspec.Struct):
    resourceVersion: str = ""
    # "continue" is a keyword in Python: the field is renamed.
    next: str = msgspec.field(default="", name="continue")


class _PodList(msgspec.Struct):
    metadata: _ListMeta
    items: list[_PodSeen]


_decode_event = msgspec.json.Decoder(_Event).decode
_decode_list = msgspec.json.Decoder(_PodList).decode


async def _wait_bound(raw: RawApi, ns: str, want: int, timeout: float) -> float:
    """List, then watch namespace ``ns`` until ``want`` pods have a node; return the monotonic
    time then. Through the lean client, decoding only each pod's name and node."""
    bound: set[str] = set()
    deadline = time.monotonic() + timeout

    async def follow() -> float:
        while True:
            rv, cont = "", ""
            while True:
                page = _decode_list(await raw.request_bytes(
                    "GET", f"/api/v1/namespaces/{ns}/pods?limit=2000"
                    + (f"&continue={cont}" if cont else "")))
                bound.update(p.metadata.name for p in page.items if p.spec.nodeName)
                rv, cont = page.metadata.resourceVersion or rv, page.metadata.next
                if not cont:
                    break
            if len(bound) >= want:
                return time.monotonic()
            try:
                async for line in raw.stream_lines(
                        f"/api/v1/namespaces/{ns}/pods?watch=1&resourceVersion={rv}"
                        "&allowWatchBookmarks=false"):
                    ev = _decode_event(line)
                    if ev.type in ("ADDED", "MODIFIED") and ev.object.spec.nodeName:
                        bound.add(ev.object.metadata.name)
                        if len(bound) >= want:
                            return time.monotonic()
            except (KubeHTTPError, ConnectionError, asyncio.IncompleteReadError,
                    msgspec.ValidationError):
                await asyncio.sleep(0.2)  # an expired or dropped watch: list again

    try:
        async with asyncio.timeout(max(1.0, deadline - time.monotonic())):
            return await follow()
    except TimeoutError:
        raise TimeoutError(f"{len(bound)} of {want} pods bound in {ns} after {timeout:.0f}s") from None


async def _phase(client: AsyncClient, raw: RawApi, ns: str, count: int, whole: bool, prefix: str,
                 timeout: float, constrained: float = 0.0, claims: bool = False,
                 claims_ahead: bool = False, meter: CpuMeter | None = None,
                 start_scheduler: Callable[[], None] | None = None) -> dict[str, Any]:
    pods = [pod(ns, f"{prefix}-{i:05d}", whole, kind_of(i, constrained), i) for i in range(count)]
    creates: list[tuple[str, Any]] = bodies(pods)
    if claims:
        creates = []
        for i in range(count):
            name = f"{prefix}-{i:05d}"
            creates.append((f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims",
                            _encode(claim_body(ns, name, whole))))
            creates.append((f"/api/v1/namespaces/{ns}/pods",
                            _encode(claim_pod_body(ns, name, name))))
    if claims and claims_ahead:
        # The claims exist before the timed window (as when a controller made them from
        # templates ahead of the pods): the time is the pods' and the scheduler's alone.
        await _submit(raw, [b for b in creates if "/resourceclaims" in b[0]])
        creates = [b for b in creates if "/resourceclaims" not in b[0]]
    if start_scheduler is not None:
        # Backlog: every pod exists before the scheduler starts; timed from its start (its
        # own lists and first cycle included) until the last is bound.
        submit = await _submit(raw, creates)
        cpu0 = meter.mark() if meter else {}
        t0 = time.monotonic()
        start_scheduler()
        done = await _wait_bound(raw, ns, count, timeout)
        out: dict[str, Any] = {"submit_seconds_before_scheduler": round(submit, 2),
                               "seconds_to_all_bound": round(done - t0, 2)}
        if meter:
            out["cpu_seconds"] = meter.since(cpu0)
        return out
    cpu0 = meter.mark() if meter else {}
    t0 = time.monotonic()
    waiter = asyncio.create_task(_wait_bound(raw, ns, count, timeout))
    submit = await _submit(raw, creates)
    done = await waiter
    out = {"submit_seconds": round(submit, 2), "seconds_to_all_bound": round(done - t0, 2)}
    if meter:
        out["cpu_seconds"] = meter.since(cpu0)
    return out


async def _delete_all(client: AsyncClient, ns: str) -> None:
    """Delete every pod (and ResourceClaim) of ``ns`` and wait until the pods are gone. A
    deletecollection of tens of thousands of pods can outlast the API server's request timeout
    (it then drops the connection, having deleted part of them): it is asked again until none
    is left."""
    from tessera.kube.claims import ResourceClaim
    with contextlib.suppress(httpx2.HTTPError, ApiError):
        await client.deletecollection(ResourceClaim, namespace=ns)
    while True:
        with contextlib.suppress(httpx2.HTTPError, ApiError):
            await client.deletecollection(Pod, namespace=ns, grace_period=0)
        for _ in range(20):
            left = [p async for p in client.list(Pod, namespace=ns)]
            if not left:
                return
            await asyncio.sleep(0.5)


async def _run(cluster: TestCluster, args: argparse.Namespace, meter: CpuMeter,
               start_scheduler: Callable[[], None] | None) -> dict[str, Any]:
    client = AsyncClient(KubeConfig.from_file(str(cluster.kubeconfig)), timeout=httpx2.Timeout(300.0))
    client_config = KubeConfig.from_file(str(args.client_kubeconfig)).get()
    assert client_config is not None
    raw = RawApi(client_config, connections=32)
    for ns in ("bulk", "starved"):
        await client.create(Namespace(metadata=ObjectMeta(name=ns)))
    await client.create(ProjectResource(metadata=ObjectMeta(name="bulk"), spec={
        "namespace": "bulk", "resources": {"gpu": {"deserved": 0}}}))
    await client.create(ProjectResource(metadata=ObjectMeta(name="starved"), spec={
        "namespace": "starved", "resources": {"gpu": {"deserved": 1}}}))
    result: dict[str, Any] = {}
    timeout = args.timeout
    # What the system burns with no pods arriving (kwok's node leases, the API server's own
    # loops): CPU seconds per second of wall time, before the timed phases.
    idle0, t_idle = meter.mark(), time.monotonic()
    await asyncio.sleep(5.0)
    idle = meter.since(idle0)
    wall = time.monotonic() - t_idle
    result["idle_cpu_per_second"] = {k: round(v / wall, 2) for k, v in idle.items()}
    if args.whole:
        print(f"phase 1: {args.whole} one-GPU pods", file=sys.stderr, flush=True)
        result["whole"] = await _phase(client, raw, "bulk", args.whole, True, "whole", timeout,
                                       args.constrained, args.claims, args.claims_ahead, meter,
                                       start_scheduler)
        print(f"  {result['whole']}", file=sys.stderr, flush=True)
        print("phase 2: reclaim one GPU for project starved", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        waiter = asyncio.create_task(_wait_bound(raw, "starved", 1, timeout))
        await client.create(pod("starved", "claim", True))
        result["reclaim_seconds"] = round(await waiter - t0, 2)
        print(f"  reclaim {result['reclaim_seconds']} s", file=sys.stderr, flush=True)
        running = len([p async for p in client.list(Pod, namespace="bulk")
                       if p.spec and p.spec.nodeName])
        result["running_during_reclaim"] = running
        if args.half:  # only phase 3 needs the GPUs back (16,000 deletions take minutes)
            t0 = time.monotonic()
            await _delete_all(client, "bulk")
            await client.delete(Pod, "claim", namespace="starved", grace_period=0)
            result["delete_seconds"] = round(time.monotonic() - t0, 2)
    if args.half:
        print(f"phase 3: {args.half} half-GPU pods", file=sys.stderr, flush=True)
        result["half"] = await _phase(client, raw, "bulk", args.half, False, "half", timeout,
                                      args.constrained, args.claims, args.claims_ahead, meter)
        print(f"  {result['half']}", file=sys.stderr, flush=True)
        res = [p async for p in client.list(Pod, namespace=names.SYSTEM_NAMESPACE,
                                            labels={names.RESERVATION_LABEL: "true"})]
        result["reservation_pods"] = len(res)
    return result


def _wait_agents_ready(cluster: TestCluster, nodes: int, timeout: float) -> None:
    """Until every node carries tessera.io/node-ready=true (the kubelet double plays the
    agents): pods submitted before would wait, and the reasons written for them, changing as
    nodes come ready, would compete with the bindings for the API server."""
    from lightkube.resources.core_v1 import Node

    client = cluster.client()
    deadline = time.monotonic() + timeout
    while True:
        ready = sum(1 for n in client.list(Node)
                    if (n.metadata.annotations or {}).get(names.NODE_READY) == "true")
        if ready >= nodes:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{ready} of {nodes} nodes ready for GPU shares after {timeout:.0f}s")
        time.sleep(1.0)


def _credentials(cluster: TestCluster, auth: str) -> tuple[Path, Path]:
    """Kubeconfigs of the scheduler and of the benchmark's client. ``serviceaccount``: the
    scheduler as its ServiceAccount with the rules of deploy/rbac.yaml (as the chart deploys
    it), the client as a ServiceAccount bound to cluster-admin, both with bound tokens (the API
    server caches a token's authentication and verifies a client certificate's chain on every
    request; in the 2,000-node run that verification was 12% of its CPU, mostly for kwok's
    requests, and the switch did not lower it measurably: docs/benchmarks.md). ``admin-cert``:
    both with the cluster's admin client certificate."""
    if auth == "admin-cert":
        return cluster.kubeconfig, cluster.kubeconfig
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "rbac.yaml"))
    sched = cluster.service_account_kubeconfig(names.SYSTEM_NAMESPACE, "tessera-scheduler",
                                               expiration_seconds=6 * 3600)
    bench = cluster.service_account_kubeconfig("tessera-bench", "client",
                                               expiration_seconds=6 * 3600)
    cluster.kubectl("create", "clusterrolebinding", "tessera-bench-client",
                    "--clusterrole=cluster-admin", "--serviceaccount=tessera-bench:client")
    return sched, bench


def _cycle_times(log: str) -> list[float]:
    """Durations of the cycles the scheduler logged (those that bound or evicted something)."""
    return [float(m.group(1)) for m in re.finditer(r"waiting in ([0-9.]+)s \(core", log)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.bench.kube")
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--whole", type=int, default=4000, help="one-GPU pods")
    parser.add_argument("--half", type=int, default=4000, help="half-GPU pods")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--constrained", type=float, default=0.0, metavar="FRACTION",
                        help="share of pods carrying a nodeSelector, node affinity (required Gt + "
                             "preferred NotIn), tolerations or hostname anti-affinity (in turn)")
    parser.add_argument("--concurrency", type=int, default=32, help="scheduler's API writes")
    parser.add_argument("--claims", action="store_true",
                        help="pods ask through ResourceClaims (DRA) instead of limits/annotations")
    parser.add_argument("--claims-ahead", action="store_true",
                        help="with --claims: create the claims before the timed window (only "
                             "the pods are timed)")
    parser.add_argument("--profile", default=None, help="cProfile the scheduler into PATH")
    parser.add_argument("--http2", action=argparse.BooleanOptionalAction, default=False,
                        help="scheduler's lightkube client talks HTTP/2")
    parser.add_argument("--logs", default=None, help="copy the scheduler's log to this file")
    parser.add_argument("--auth", choices=("serviceaccount", "admin-cert"),
                        default="serviceaccount",
                        help="how the scheduler and the client authenticate (see _credentials)")
    parser.add_argument("--apiserver-arg", action="append", default=[], metavar="FLAG",
                        help="extra kube-apiserver flag for this run (repeatable), e.g. "
                             "--apiserver-arg=--profiling=true; recorded in the JSON")
    parser.add_argument("--node-lease-seconds", type=int, default=40,
                        help="kwok's node lease duration (default 40: a kubelet's; each node "
                             "renews every quarter of it)")
    parser.add_argument("--backlog", action="store_true",
                        help="phase 1's pods are all created before the scheduler starts; "
                             "reported as backlog_pods_per_second (the scheduler's own drain "
                             "rate), not pods_per_second")
    parser.add_argument("--go-gc", type=int, default=None, metavar="PERCENT",
                        help="GOGC for etcd, kube-apiserver and kwok (Go's default: 100); a "
                             "benchmark-harness setting, recorded in the JSON")
    args = parser.parse_args(argv)
    if args.go_gc is not None and args.go_gc <= 0:
        parser.error(f"--go-gc: must be a positive percentage, got {args.go_gc}")
    if args.backlog and args.claims:
        parser.error("--backlog: not with --claims")

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    cluster = TestCluster(report=say, extra_args={
        "kube-apiserver": list(args.apiserver_arg),
        "kwok": [f"--node-lease-duration-seconds={args.node_lease_seconds}"]})
    log_text = ""
    procs: list[subprocess.Popen[bytes]] = []
    if args.go_gc is not None:
        os.environ["GOGC"] = str(args.go_gc)  # inherited by the cluster's Go processes
    try:
        cluster.start()
        t0 = time.monotonic()
        cluster.create_gpu_nodes(args.nodes, NodeShape(gpus=args.gpus_per_node),
                                 timeout=max(60.0, args.nodes * 0.5), node_agents=False)
        say(f"{args.nodes} nodes ready in {time.monotonic() - t0:.1f} s")
        cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "crds"))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                        "crd/projects.tessera.io", "crd/podgroups.tessera.io")
        assert cluster.workdir is not None
        logs = cluster.workdir / "logs"
        sched_kubeconfig, args.client_kubeconfig = _credentials(cluster, args.auth)
        sched = [sys.executable]
        if args.profile:
            sched += ["-m", "cProfile", "-o", args.profile]
        # One replica: no leader election (on a loaded 2-core machine a renewal that times out
        # would stop the scheduler in the middle of the run).
        sched += ["-m", "tessera.kube.scheduler", f"--kubeconfig={sched_kubeconfig}",
                  "--no-leader-elect",
                  f"--concurrency={args.concurrency}",
                  "--http2" if args.http2 else "--no-http2"]
        def start(name: str, cmd: list[str]) -> int:
            log = (logs / f"bench-{name}.log").open("ab")
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL))
            return procs[-1].pid

        # One tessera-node per node does not fit here at hundreds of nodes: the kubelet double
        # plays the two things the scheduler waits for from the agents.
        pids = {p.name: p.popen.pid for p in cluster.processes if p.popen is not None}
        pids["kubelet-double"] = start("kubelet-double", [
            sys.executable, "-m", "tessera.testing.kubelet", f"--kubeconfig={cluster.kubeconfig}",
            "--play-agents"])
        pids["bench-client"] = os.getpid()
        meter = CpuMeter(pids)

        def start_scheduler() -> None:
            meter.pids["scheduler"] = start("scheduler", sched)

        if not args.backlog:
            start_scheduler()
        time.sleep(1.0)
        t0 = time.monotonic()
        _wait_agents_ready(cluster, args.nodes, timeout=max(120.0, args.nodes * 0.3))
        say(f"tessera-node readiness on every node (kubelet double) in {time.monotonic() - t0:.1f} s")
        result = asyncio.run(_run(cluster, args, meter,
                                  start_scheduler if args.backlog else None))
        log_text = (logs / "bench-scheduler.log").read_text(errors="replace")
        if args.logs:
            for p in procs:
                p.terminate()
                p.wait(30)
            shutil.copyfile(logs / "bench-scheduler.log", args.logs)
            say(f"scheduler log: {args.logs}")
    finally:
        stop_processes(procs)
        cluster.stop()
    whole = result.get("whole", {}).get("seconds_to_all_bound", 0.0)
    half = result.get("half", {}).get("seconds_to_all_bound", 0.0)
    pods = (args.whole if "whole" in result else 0) + (args.half if "half" in result else 0)
    total = whole + half
    cycles = _cycle_times(log_text)
    out = {
        "nodes": args.nodes,
        "constrained": args.constrained,
        "claims": args.claims,
        "claims_ahead": args.claims_ahead,
        "cycles_logged": len(cycles),
        "cycle_seconds_p50": round(sorted(cycles)[len(cycles) // 2], 3) if cycles else None,
        "cycle_seconds_max": round(max(cycles), 3) if cycles else None,
        "http2": args.http2,
        "apiserver_args": args.apiserver_arg,
        "auth": args.auth,
        "gpus": args.nodes * args.gpus_per_node,
        "node_lease_seconds": args.node_lease_seconds,
        "go_gc": args.go_gc,
        "pods": pods,
        "seconds_to_all_bound": round(total, 2),
        # A backlog run (pods created before the scheduler started) measures another thing:
        # it has its own name, and pods_per_second (pods arriving while it runs) is not set.
        "pods_per_second": None if args.backlog else round(pods / total, 1) if total else None,
        "backlog_pods_per_second": round(pods / total, 1) if args.backlog and total else None,
        "reclaim_seconds": result.get("reclaim_seconds"),
        **{k: v for k, v in result.items() if k != "reclaim_seconds"},
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

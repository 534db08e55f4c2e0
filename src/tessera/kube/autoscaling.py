"""Inference that scales on Kubernetes: ``tessera inference submit NAME --port 8080
--min-replicas 1 --max-replicas 4 --metric concurrency --metric-threshold 2 -- CMD``
(REST ``spec.autoscaling`` with one ``spec.ports`` entry).

What is made, all owned by the workload's PodGroup (the garbage collector removes them with it):

* a ``Deployment`` ``NAME`` of ``minReplicas`` replicas; each pod is the pod tessera would have
  made (GPU share annotations, ``schedulerName: tessera``) plus a container ``tessera-proxy``
  (tessera.kube.replica_proxy, image ``$TESSERA_REPLICA_PROXY_IMAGE``, the chart's tessera
  image) in front of the model server's port, counting connections;
* a ``Service`` ``NAME`` (ClusterIP) whose port (``--port``) goes to the replicas' proxies: the
  stable URL ``http://NAME.NAMESPACE.svc.cluster.local:PORT``.

:class:`KubeAutoscaler`, a loop in the API server, reads every replica's proxy each second
(``http://POD_IP:9464/activity``: when its connections opened and closed,
tessera.kube.replica_activity), sums them into the metric (``concurrency``: connections open;
``throughput``: connections opened per second over the last 10 s) as a function of time, and
applies the rule both backends share (tessera.core.autoscale.decide) to the Deployment's
``spec.replicas``: up at once, down the scale-down delay after the need fell (when idle: after
the last connection closed), the loop waking exactly when that is due rather than at its next
second. Before scaling down it sets each replica's ``controller.kubernetes.io/pod-deletion-cost``
to its open connections, so the ReplicaSet controller removes idle replicas first.
"""

from __future__ import annotations

import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from lightkube import Client

from tessera.api.periodic import Periodic
from tessera.core.autoscale import (
    CONCURRENCY_WINDOW,
    THROUGHPUT_WINDOW,
    ScalingRule,
    decide,
    rate,
    total,
)
from tessera.kube import names, replica_proxy
from tessera.kube import workload_docs as wd
from tessera.kube.replica_activity import Activity, fetch

log = logging.getLogger(__name__)

RULE = "tessera.io/autoscaling"
SUSPENDED = "tessera.io/suspended"
"""On the Deployment while the workload is suspended: 0 replicas, the autoscaler leaves it."""
"""The Deployment's annotation holding the workload's ``spec.autoscaling``."""
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
DEFAULT_PROXY_IMAGE = "ghcr.io/tessera-gpu/tessera:latest"


def is_scaling(rec: wd.Record) -> bool:
    return bool((rec.spec or {}).get("autoscaling"))


def _ports(rec: wd.Record) -> tuple[int, int]:
    """(the Service's port, the model server's port in the pod)."""
    p = ((rec.spec or {}).get("ports") or [])[0]
    return int(p.get("external") or p["container"]), int(p["container"])


def url(rec: wd.Record) -> str:
    return wd.service_url(rec.name, rec.namespace, _ports(rec)[0])


def _owned(rec: wd.Record, owner_uid: str) -> dict[str, Any]:
    meta = wd.owned_meta(rec, owner_uid)
    meta["labels"][wd.WORKLOAD_TYPE] = rec.type
    return meta


def build_deployment(rec: wd.Record, owner_uid: str, proxy_image: str) -> dict[str, Any]:
    pod = wd.build_pod(rec, 0, None).to_dict()
    meta = pod["metadata"]
    for key in ("name", "namespace", "ownerReferences"):
        meta.pop(key, None)
    meta["labels"].pop(wd.POD_INDEX, None)
    spec = pod["spec"]
    spec["restartPolicy"] = "Always"
    target = _ports(rec)[1]
    app = spec["containers"][0]
    app["env"] = [e for e in app.get("env") or [] if e["name"] != "TESSERA_POD_INDEX"] + [
        {"name": "PORT", "value": str(target)}]
    spec["containers"].append({
        "name": "tessera-proxy", "image": proxy_image,
        "command": ["python", "-m", "tessera.kube.replica_proxy",
                    f"--port={replica_proxy.PORT}", f"--target={target}",
                    f"--metrics-port={replica_proxy.METRICS_PORT}"],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [{"name": "proxy", "containerPort": replica_proxy.PORT},
                  {"name": "metrics", "containerPort": replica_proxy.METRICS_PORT}],
        "readinessProbe": {"tcpSocket": {"port": replica_proxy.PORT}},
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}})
    rule = (rec.spec or {})["autoscaling"]
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {**_owned(rec, owner_uid), "annotations": {RULE: json.dumps(rule)}},
            "spec": {"replicas": int(rule.get("minReplicas", 1)),
                     "selector": {"matchLabels": {wd.WORKLOAD_ID: rec.id}},
                     "template": {"metadata": meta, "spec": spec}}}


def build_service(rec: wd.Record, owner_uid: str) -> dict[str, Any]:
    port = _ports(rec)[0]
    return {"apiVersion": "v1", "kind": "Service", "metadata": _owned(rec, owner_uid),
            "spec": {"type": "ClusterIP", "selector": {wd.WORKLOAD_ID: rec.id},
                     "ports": [{"name": "http", "protocol": "TCP", "port": port,
                                "targetPort": replica_proxy.PORT}]}}


def create(client: Client, rec: wd.Record, owner_uid: str) -> None:
    from lightkube.resources.apps_v1 import Deployment
    from lightkube.resources.core_v1 import Service

    image = os.environ.get("TESSERA_REPLICA_PROXY_IMAGE") or DEFAULT_PROXY_IMAGE
    dep: Deployment = Deployment.from_dict(  # type: ignore[assignment]
        build_deployment(rec, owner_uid, image))
    client.create(dep, namespace=rec.namespace)
    svc: Service = Service.from_dict(build_service(rec, owner_uid))  # type: ignore[assignment]
    client.create(svc, namespace=rec.namespace)


def suspend(client: Client, rec: wd.Record, on: bool) -> bool:
    """Suspend (0 replicas, not scaled) or resume (``minReplicas``) a scaling inference's
    Deployment; False (nothing done) when ``rec`` is no scaling inference."""
    from lightkube.resources.apps_v1 import Deployment
    from lightkube.types import PatchType

    if not is_scaling(rec):
        return False
    replicas = 0 if on else int((rec.spec or {})["autoscaling"].get("minReplicas", 1))
    client.patch(Deployment, rec.name, {
        "metadata": {"annotations": {SUSPENDED: "true" if on else None}},
        "spec": {"replicas": replicas}}, namespace=rec.namespace, patch_type=PatchType.MERGE)
    return True


class KubeAutoscaler(Periodic):
    """Each second (and when a scale-down falls due): every scaling inference's activity from
    its replicas' proxies, and the Deployment's replicas set by the shared rule."""

    thread_name = "tessera-autoscaler"

    def __init__(self, client: Client, interval: float = 1.0) -> None:
        super().__init__(interval)
        self.client: Any = client
        self.state: dict[str, Activity] = {}
        self.http = httpx.Client(trust_env=False, limits=httpx.Limits(max_connections=32))
        """For the replicas' proxies (plain HTTP to pod IPs; never through a proxy)."""
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="tessera-autoscaler-read")

    def stop(self) -> None:
        super().stop()
        self._pool.shutdown(wait=False)

    def next_wait(self) -> float:
        """Until the next second, or sooner when a scale-down falls due before it."""
        now = time.time()
        dues = [st.due - now for st in list(self.state.values()) if st.due is not None]
        return max(0.02, min([self.interval, *dues]))

    def step(self) -> None:
        from lightkube.resources.apps_v1 import Deployment

        seen = set()
        for dep in self.client.list(Deployment, namespace="*", labels={
                names.MANAGED_BY: wd.MANAGER, wd.WORKLOAD_TYPE: "Inference"}):
            ann = dep.metadata.annotations or {}
            wid = (dep.metadata.labels or {}).get(wd.WORKLOAD_ID)
            if RULE not in ann or not wid or dep.metadata.deletionTimestamp is not None \
                    or ann.get(SUSPENDED) == "true":
                continue
            seen.add(wid)
            try:
                self._one(dep, wid, ScalingRule.from_spec(json.loads(ann[RULE])))
            except Exception as exc:  # one workload's trouble never stops the others
                log.warning("autoscaling %s/%s: %r", dep.metadata.namespace,
                            dep.metadata.name, exc)
        for wid in set(self.state) - seen:
            del self.state[wid]

    def _one(self, dep: Any, wid: str, rule: ScalingRule) -> None:
        from lightkube.resources.apps_v1 import Deployment
        from lightkube.resources.core_v1 import Pod
        from lightkube.types import PatchType

        ns, name = dep.metadata.namespace, dep.metadata.name
        st = self.state.setdefault(wid, Activity(known_since=time.time()))
        costs: dict[str, str | None] = {}
        pods = [p for p in self.client.list(Pod, namespace=ns, labels={wd.WORKLOAD_ID: wid})
                if p.status is not None and p.status.podIP]
        live = {p.metadata.name for p in pods}  # a deleted one drains: its connections count
        for pod in pods:
            if pod.metadata.deletionTimestamp is None:
                costs[pod.metadata.name] = (pod.metadata.annotations or {}).get(DELETION_COST)
        # All replicas read at once; the decision's "now" is the first answer's time: the
        # activity is known up to then for every replica read.
        answers = list(self._pool.map(lambda p: (fetch(p.status.podIP, self.http), time.time()),
                                      pods))
        now = min((t for _, t in answers), default=time.time())
        unread: list[str] = []
        for pod, (doc, received) in zip(pods, answers, strict=True):
            if doc is not None:
                st.update(pod.metadata.name, doc, received)
            elif pod.metadata.deletionTimestamp is None:  # one going may have stopped already
                unread.append(pod.metadata.name)
        st.went(live, now)
        st.prune(now - max(rule.scale_down_delay, CONCURRENCY_WINDOW) - THROUGHPUT_WINDOW - 1)
        steps = rate(st.opened()) if rule.metric == "throughput" else total(st.series())
        have = int(dep.spec.replicas if dep.spec.replicas is not None else 1)
        d = decide(rule, have, steps, now, st.known_since)
        st.due = d.due
        if d.replicas < have and (late := st.unread_recently(unread, now)):
            # What a replica did since it was last read is unknown: its connections may be
            # open. Its proxy keeps that, so the next look (in a second) knows.
            log.info("autoscaling %s/%s: not scaling down yet, replica(s) %s did not answer",
                     ns, name, ", ".join(late))
            return
        if d.replicas == have:
            return
        if d.replicas < have:  # the ReplicaSet controller removes the cheapest: the idle ones
            for pod_name, n in st.open_by_pod().items():
                if pod_name in costs and costs[pod_name] != str(n) \
                        and (n or costs[pod_name] is not None):  # none is 0 already
                    self.client.patch(Pod, pod_name, {"metadata": {"annotations": {
                        DELETION_COST: str(n)}}}, namespace=ns, patch_type=PatchType.MERGE)
        self.client.patch(Deployment, name, {"spec": {"replicas": d.replicas}}, namespace=ns,
                          patch_type=PatchType.MERGE)
        st.history.append((time.time(), d.replicas))  # decided: the Deployment says so
        st.due = decide(rule, d.replicas, steps, now, st.known_since).due  # a next step down
        log.info("autoscaling %s/%s: %d -> %d replicas (%s; lower need since %s, due %s, "
                 "decided %.3f)", ns, name, have, d.replicas, rule.metric, d.lower_since, d.due,
                 now)

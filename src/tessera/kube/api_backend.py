"""``tessera.api.backend.Backend`` on a Kubernetes cluster: the REST API (and so the CLI) drive
Projects, PodGroups and pods through the API server; ``tessera-scheduler`` places them.

Reads go to the API server on every request (no cache), so a listing always shows what a
submit or delete just did. A small reconcile loop (``reconcile``) plays the workload
controller: it creates the pods a workload is missing (after an eviction by reclaim or
preemption, or a resume) unless the workload is suspended or asked to fail when evicted.
Projects are ``tessera.kube.cluster_projects``, reading workloads and their documents
``tessera.kube.cluster_workloads``, validation ``tessera.api.validation``; what stays here is
submitting (PodGroup + pods), suspend/resume/delete, the reconcile loop, logs and exec
(about 480 lines: the ``Backend`` surface on Kubernetes, each method a few API calls).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lightkube import ApiError, Client, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from tessera import decoding, wire
from tessera.api.auth import TokenAuth
from tessera.api.backend import (
    Conflict,
    NotFound,
    ProjectFields,
    Upstream,
    WorkloadQuery,
    WorkloadSubmission,
)
from tessera.api.token_store import TokenStore
from tessera.api.usage import merge
from tessera.api.validation import (
    check_limit,
    check_mig_limit,
    check_mig_profile,
    check_submission,
)
from tessera.core.errors import InvalidRequest
from tessera.core.mig import profile_slots
from tessera.core.model import Node as CoreNode
from tessera.core.request_text import request_text
from tessera.core.requests import check_against_cluster, gpu_request_to_dict
from tessera.kube import autoscaling, names, services, sweeps
from tessera.kube import workload_docs as wd
from tessera.kube.agent_usage import AgentPoller
from tessera.kube.cluster_projects import ClusterProjects, api_message, api_status
from tessera.kube.cluster_workloads import ISOLATION, ClusterWorkloads
from tessera.kube.compute_usage import add_gpu_time
from tessera.kube.mig import hold_from_json
from tessera.kube.node_cache import CachedNode, NodeCache
from tessera.kube.objects import PodGroupResource, node_info
from tessera.kube.podspec import pod_request_from_dict
from tessera.kube.prometheus_usage import PrometheusUsage
from tessera.kube.tenancy_sync import TenancySync, allocations_of
from tessera.kube.unsupported import refuse_unsupported
from tessera.kube.upstream import explain

log = logging.getLogger(__name__)

SORTABLE = {"name": "name", "createdAt": "createdAt", "phase": "phase",
            "projectName": "projectName", "type": "type", "gpus": "_gpus"}
FILTER_KEY = {"status": "phase"}
SIMULATED_LABEL = "tessera.io/simulated"


class KubeBackend(TokenAuth):
    """Implements ``tessera.api.backend.Backend`` against a Kubernetes API server."""

    def __init__(self, client: Client, data_dir: Path, image: str = wd.DEFAULT_IMAGE) -> None:
        decoding.warm()  # before any of its threads decodes (tessera.decoding)
        self.client: Any = client
        """Typed loosely: lightkube's models make every field Optional."""
        self.data_dir = data_dir
        self.image = image
        self.auth_store: TokenStore = TokenStore(data_dir / "tessera.db")
        """Only API clients and token hashes live on disk; workloads live in the cluster."""
        self.project_objects = ClusterProjects(client, threading.Lock())
        """Projects as Project objects and namespaces (tessera.kube.cluster_projects)."""
        self.workloads = ClusterWorkloads(client)
        """Reading workloads and their documents (tessera.kube.cluster_workloads)."""
        self.node_cache = NodeCache(client)
        """The Nodes, followed by a watch (not listed per request)."""
        prometheus = os.environ.get("TESSERA_PROMETHEUS_URL", "")
        self.usage: AgentPoller | PrometheusUsage = (
            PrometheusUsage(prometheus, lambda: list(self._agent_urls())) if prometheus
            else AgentPoller(self._agent_urls))
        """GPU memory used, loans and utilisation: each node's tessera-node polled, or the
        Prometheus that scrapes them (TESSERA_PROMETHEUS_URL)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.tenancy = TenancySync(client, data_dir, self.project_objects.docs, lambda:
                                   allocations_of(self.workloads, lambda: self._nodes(True)))
        """Access rules as RoleBindings; GPU accounting (tessera.kube.tenancy_sync)."""

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, interval: float = 1.0) -> None:
        self._thread = threading.Thread(target=self._loop, args=(interval,),
                                        name="tessera-kube-reconcile", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.node_cache.stop()
        self.usage.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.auth_store.close()
        self.tenancy.close()

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.reconcile()
                self.tenancy.step()
            except Exception as exc:
                log.warning("reconcile failed: %r", exc)

    # -- auth ------------------------------------------------------------------------------------

    # -- reading the cluster ---------------------------------------------------------------------

    def _nodes(self, cached: bool = False
               ) -> tuple[dict[str, CoreNode], dict[str, tuple[str, ...]], bool, str | None]:
        """The GPU nodes; ``cached``: from the watch-fed cache (the console's views), else read
        now (what a submission is checked against, or a pod's document is computed from)."""
        nodes: dict[str, CoreNode] = {}
        uuids: dict[str, tuple[str, ...]] = {}
        simulated = False
        driver = None
        entries = (self.node_cache.items().values() if cached else
                   (CachedNode(node_info(o), dict(o.metadata.labels or {}))
                    for o in self.client.list(Node)))
        for entry in entries:
            info, labels = entry.info, entry.labels
            if info.node is None or not info.node.gpus:
                continue
            nodes[info.name] = info.node
            uuids[info.name] = info.uuids
            simulated = simulated or labels.get(SIMULATED_LABEL) == "true"
            major = labels.get("nvidia.com/cuda.driver.major")
            if major and driver is None:
                driver = ".".join(labels.get(f"nvidia.com/cuda.driver.{k}", "0")
                                  for k in ("major", "minor", "rev"))
        return nodes, uuids, simulated, driver

    def _agent_urls(self) -> dict[str, str]:
        """GPU node -> the address its agent published ('' when none)."""
        return {name: e.agent_url for name, e in self.node_cache.items().items()
                if e.info.node is not None and e.info.node.gpus}

    def upstream(self, exc: Exception) -> Upstream | None:
        return explain(exc, str(self.client.config.cluster.server))

    def simulated(self) -> bool:
        return any(n.labels.get(SIMULATED_LABEL) == "true"
                   for n in self.node_cache.items().values())

    def cluster(self) -> dict[str, Any]:
        nodes, uuids, simulated, driver = self._nodes(cached=True)
        tenants: dict[tuple[str, int], list[dict[str, Any]]] = {}
        mig_holders: dict[tuple[str, int], dict[str, Any]] = {}  # (GPU, slot) -> holder, project
        for pod in self.client.list(Pod, namespace="*",
                                    fields={"spec.schedulerName": names.SCHEDULER_NAME}):
            doc = wd.pod_doc(pod, nodes, uuids)
            labels = pod.metadata.labels or {}
            holder = labels.get(wd.WORKLOAD) or pod.metadata.name
            hold = (pod.metadata.annotations or {}).get(names.MIG_PARTITION)
            if hold and doc["phase"] not in ("Succeeded", "Failed"):
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    h = hold_from_json(hold)
                    mig_holders[(h.gpu, h.start)] = {"workload": holder,
                                                     "project": labels.get(names.PROJECT, "")}
            if doc["phase"] in ("Succeeded", "Failed") or not doc["gpuDevices"]:
                continue
            for d in doc["gpuDevices"]:
                tenants.setdefault((doc["nodeName"], d["index"]), []).append({
                    "name": holder, "project": labels.get(names.PROJECT, ""),
                    "pod": f"{pod.metadata.namespace}/{pod.metadata.name}",
                    "bytes": d["requestBytes"], "exclusive": doc["exclusive"]})
        out_nodes = []
        mig = {n: e.info.mig for n, e in self.node_cache.items().items() if e.info.mig}
        for name in sorted(set(nodes) | set(mig)):
            gpus = []
            for g in nodes[name].gpus if name in nodes else ():
                held = tenants.get((name, g.index), [])
                allocated = sum(g.memory if h["exclusive"] else h["bytes"] for h in held)
                gpus.append({"index": g.index, "uuid": g.uuid, "model": g.model,
                             "product": g.product, "memoryBytes": g.memory,
                             "headroomBytes": g.headroom, "allocatedBytes": allocated, "workloads": held})
            node_doc: dict[str, Any] = {"name": name, "gpus": gpus}
            if name in mig:  # GPUs in MIG mode and their partitions (docs/mig.md)
                node_doc["migGpus"] = [{"index": g.index, "uuid": g.uuid, "model": g.model,
                                        "partitions": [
                    {"profile": p.profile, "start": p.start,
                     "slots": profile_slots(g.model, p.profile), "uuid": p.uuid or None,
                     "managed": not p.busy, **mig_holders.get((g.uuid, p.start), {"workload": None})}
                    for p in g.partitions]} for g in mig[name]]
            out_nodes.append(node_doc)
        return merge({
            "backend": "kubernetes",
            "simulated": simulated,
            "driver": driver,
            "scheduler": f"{names.COMPONENT} (schedulerName: {names.SCHEDULER_NAME})",
            "isolation": ISOLATION,
            "nodes": out_nodes,
        }, self.usage.reports())

    # -- projects --------------------------------------------------------------------------------

    def create_project(self, fields: ProjectFields) -> dict[str, Any]:
        return self.project_objects.create(fields)

    def projects(self) -> list[dict[str, Any]]:
        return self.project_objects.docs()

    def project(self, id_or_name: str) -> dict[str, Any]:
        return self.project_objects.doc(self.project_objects.get(id_or_name))

    def update_project(self, id_or_name: str, fields: ProjectFields) -> dict[str, Any]:
        return self.project_objects.update(id_or_name, fields)

    def delete_project(self, id_or_name: str) -> None:
        self.project_objects.delete(id_or_name)

    # -- submit ----------------------------------------------------------------------------------

    def submit(self, s: WorkloadSubmission) -> dict[str, Any]:
        admitted = check_submission(s)
        refuse_unsupported(s)
        fraction = self._check_mig(s.mig_profile, s.workers) if s.mig_profile is not None else None
        pclass, min_workers = admitted.priority_class, admitted.min_workers
        nodes, _, _, _ = self._nodes()
        check_against_cluster(s.gpu, nodes.values(), (min_workers, s.workers))
        try:
            project = self.project_objects.get(s.project)
        except NotFound:
            raise InvalidRequest("projectId", "no project with this id or name", s.project) from None
        pdoc = self.project_objects.doc(project)
        namespace = pdoc["namespace"]
        if not namespace:
            raise InvalidRequest("projectId", "the project has no spec.namespace (a department "
                                 "cannot run workloads)", s.project)
        limit = pdoc["resources"]["gpu"]["limit"]
        if fraction is not None:
            check_mig_limit(fraction, s.workers, pdoc["name"], limit, value=s.mig_profile)
        else:
            check_limit(s.gpu, nodes.values(), s.workers, pdoc["name"], limit, admitted.compute)
        rec = wd.Record(
            id=str(uuid.uuid4()), name=s.name, namespace=namespace, project=pdoc["name"],
            type=s.type, argv=list(s.command), env=dict(s.env), image=s.image or self.image,
            working_dir=s.working_dir if s.spec.get("workingDir") and s.working_dir else None,
            priority_class=pclass, preemptible=admitted.preemptible,
            workers=s.workers, min_workers=min_workers, request=gpu_request_to_dict(s.gpu),
            on_eviction=str(s.spec.get("onEviction", "requeue")),
            spec={**{k: v for k, v in s.spec.items() if k not in ("workingDir",)},
                  "_submittedBy": s.submitted_by, services.URLS: services.urls(s, namespace)},
            mig_profile=s.mig_profile,
        )
        # The pods must read back as the same request (the scheduler's parser is the judge).
        probe = wd.build_pod(rec, 0, None).to_dict()
        if pod_request_from_dict(probe).gpu != s.gpu:
            raise InvalidRequest("spec.compute", "cannot be written as tessera.io annotations")
        group = PodGroupResource(
            metadata=ObjectMeta(
                name=s.name, namespace=namespace,
                labels={names.MANAGED_BY: wd.MANAGER, wd.WORKLOAD_ID: rec.id,
                        wd.WORKLOAD_TYPE: s.type},
                annotations={wd.RECORD: rec.to_json()},
            ),
            spec={"minMember": min_workers, "project": pdoc["name"], "priorityClassName": pclass},
        )
        try:
            created = self.client.create(group)
        except ApiError as exc:
            if api_status(exc) == 409:
                raise Conflict(f"a workload named {s.name} already exists in project "
                               f"{pdoc['name']}") from None
            raise Upstream(f"PodGroup {namespace}/{s.name}: {api_message(exc)}") from None
        try:  # a Deployment (kube.autoscaling), an Indexed Job (kube.sweeps) or pods; a Service
            services.make(self.client, rec, created.metadata.uid, lambda: self._create_pods(
                rec, created.metadata.uid, range(s.workers), new=True))
        except Exception:
            self._delete_all(namespace, s.name, rec.id)
            raise
        self._event(created, "Submitted", f"submitted to project {pdoc['name']}: "
                    f"{request_text(s.gpu, s.workers, s.mig_profile)}")
        return self.workloads.doc(self.workloads.managed(created, self.workloads.pods_of(namespace, rec.id)),
                                  nodes, {}, brief=False, events=False)

    def _check_mig(self, profile: str, workers: int) -> float:
        """A MIG profile some node's GPU in MIG mode has (read now, from each tessera-node's
        inventory): its GPU fraction; else the refusal (tessera.api.validation, the same words
        as embedded mode). Whether there is room is the scheduler's to say (the pod waits with
        the reason)."""
        models = {g.model for o in self.client.list(Node) for g in node_info(o).mig}
        return check_mig_profile(profile, models, "on this cluster", workers)

    def _create_pods(self, rec: wd.Record, owner_uid: str | None, indices: Iterable[int],
                     new: bool = False) -> int:
        """Create the pods; an existing one (409) is this workload's when not ``new`` (the
        reconcile loop racing a submit or resume). The API server's refusals (an admission
        webhook, a ResourceQuota) are the user's to fix: 422 with its message."""
        made = 0
        for i in indices:
            name = f"{rec.namespace}/{rec.name}-{i}"
            try:
                self.client.create(wd.build_pod(rec, i, owner_uid))
                made += 1
            except ApiError as exc:
                code = api_status(exc)
                if code == 409 and not new:
                    continue
                if code == 409:
                    raise Conflict(f"a pod named {name} already exists (not this workload's); "
                                   "choose another name") from None
                if code in (400, 422) or (code == 403 and "exceeded quota" in api_message(exc)):
                    raise InvalidRequest("spec", f"the API server refused pod {name}: "
                                         f"{api_message(exc)}") from None
                raise Upstream(f"pod {name}: {api_message(exc)}") from None
        return made

    def _delete_all(self, namespace: str, name: str, wid: str) -> None:
        with contextlib.suppress(ApiError):
            self.client.delete(PodGroupResource, name, namespace=namespace)
        for pod in self.client.list(Pod, namespace=namespace, labels={wd.WORKLOAD_ID: wid}):
            with contextlib.suppress(ApiError):
                self.client.delete(Pod, pod.metadata.name, namespace=namespace)

    def _event(self, group: Any, reason: str, message: str, type_: str = "Normal") -> None:
        meta = group.metadata
        obj = codecs.from_dict(wire.event_body(
            kind="PodGroup", name=meta.name, namespace=meta.namespace, uid=meta.uid,
            reason=reason, message=message, type_=type_, component=wd.MANAGER,
            instance=wd.MANAGER, api_version=f"{names.GROUP}/{names.VERSION}"))
        try:
            self.client.create(obj)
        except ApiError as exc:  # best effort, as Events are
            log.warning("event %s on %s/%s: %s", reason, meta.namespace, meta.name, exc)

    # -- workloads -------------------------------------------------------------------------------

    def workloads_json(self, query: WorkloadQuery) -> tuple[str, int]:
        nodes, uuids, simulated, _ = self._nodes()
        docs = []
        for entry in self.workloads.entries():
            doc = self.workloads.doc(entry, nodes, uuids, brief=True, simulated=simulated)
            doc["_gpus"] = doc["gpus"]["requested"]
            docs.append(doc)
        for key, op, value in query.filters:
            k = FILTER_KEY.get(key, key)
            if op == "==":
                docs = [d for d in docs if str(d.get(k) or "") == value]
            elif op == "!=":
                docs = [d for d in docs if str(d.get(k) or "") != value]
            else:
                docs = [d for d in docs if value.lower() in str(d.get(k) or "").lower()]
        if query.projects is not None:  # the caller's visible projects (tessera.api.tenancy)
            docs = [d for d in docs if d.get("projectName") in query.projects]
        if query.search:
            text = query.search.lower()
            docs = [d for d in docs if text in d["name"].lower()]
        skey = SORTABLE[query.sort_by]
        docs.sort(key=lambda d: (d[skey] is None, d[skey] or 0, d["createdAt"]), reverse=query.descending)
        total = len(docs)
        page = docs[query.offset: query.offset + query.limit]
        for d in page:
            d.pop("_gpus", None)
        fields = query.fields
        if query.rows:
            keys = list(fields or [])
            return json.dumps([[d.get(k) for k in keys] for d in page]), total
        if fields:
            page = [{k: d.get(k) for k in fields} for d in page]
        else:
            for d in page:
                d.pop("namespace", None)
        return json.dumps(page), total

    def workload(self, workload_id: str, kind: str | None = None) -> dict[str, Any]:
        entry = self.workloads.find(workload_id, kind)
        nodes, uuids, simulated, _ = self._nodes()
        doc = self.workloads.doc(entry, nodes, uuids, brief=False, simulated=simulated)
        return add_gpu_time(doc, self.usage.reports())  # the compute share's measured GPU time

    def delete_workload(self, workload_id: str, kind: str | None = None) -> None:
        entry = self.workloads.find(workload_id, kind)
        rec = entry.rec
        if entry.managed:
            self._delete_all(rec.namespace, rec.name, rec.id)
            return
        if entry.controller:
            raise Conflict(f"workload {rec.name}'s pods belong to {entry.controller}, which would "
                           f"create them again; delete {entry.controller} in namespace "
                           f"{rec.namespace} instead")
        for pod in entry.pods:
            with contextlib.suppress(ApiError):
                self.client.delete(Pod, pod.metadata.name, namespace=rec.namespace)

    @staticmethod
    def _submitted(entry: wd.Entry, verb: str) -> None:
        if not entry.managed:
            raise Conflict(f"workload {entry.rec.name} was applied as Kubernetes objects, not "
                           f"submitted with tessera; only submitted workloads {verb}")

    def suspend(self, workload_id: str, kind: str | None = None) -> dict[str, Any]:
        entry = self.workloads.find(workload_id, kind)
        self._submitted(entry, "suspend")
        rec = entry.rec
        doc = self.workload(workload_id, kind)
        if doc["phase"] not in ("Pending", "Running"):
            raise Conflict(f"workload {rec.name} is {doc['phase']}; only Pending or Running "
                           "suspend")
        self.client.patch(PodGroupResource, rec.name, {"metadata": {"annotations": {
            wd.SUSPENDED: "true"}}}, namespace=rec.namespace, patch_type=PatchType.MERGE)
        for pod in [] if services.suspend(self.client, rec, True) else self.workloads.pods_of(
                rec.namespace, rec.id):  # a Job's or Deployment's controller removes its pods
            with contextlib.suppress(ApiError):
                self.client.delete(Pod, pod.metadata.name, namespace=rec.namespace)
        self._event(entry.group, "Suspended", "suspended by user; its pods are deleted")
        return self.workload(workload_id, kind)

    def resume(self, workload_id: str, kind: str | None = None) -> dict[str, Any]:
        entry = self.workloads.find(workload_id, kind)
        self._submitted(entry, "resume")
        rec = entry.rec
        doc = self.workload(workload_id, kind)
        if doc["phase"] != "Stopped":
            raise Conflict(f"workload {rec.name} is {doc['phase']}; only Stopped workloads resume")
        self.client.patch(PodGroupResource, rec.name, {"metadata": {"annotations": {
            wd.SUSPENDED: None}}}, namespace=rec.namespace, patch_type=PatchType.MERGE)
        _ = services.suspend(self.client, rec, False) or self._create_pods(
            rec, entry.group.metadata.uid, range(rec.workers))
        self._event(entry.group, "Resumed", "resumed by user; its pods are created again")
        return self.workload(workload_id, kind)

    # -- controller ------------------------------------------------------------------------------

    def reconcile(self) -> int:
        """Create the pods workloads are missing (evicted ones requeue); returns how many."""
        pods_by: dict[str, list[Any]] = {}
        for pod in self.client.list(Pod, namespace="*", labels={names.MANAGED_BY: wd.MANAGER}):
            wid = (pod.metadata.labels or {}).get(wd.WORKLOAD_ID)
            if wid:
                pods_by.setdefault(wid, []).append(pod)
        made = 0
        for g in self.workloads.groups():
            ann = g.metadata.annotations or {}
            if g.metadata.deletionTimestamp is not None or ann.get(wd.SUSPENDED) == "true" \
                    or ann.get(wd.FAILED) or wd.RECORD not in ann:
                continue
            rec = wd.Record.from_json(ann[wd.RECORD])
            pods = pods_by.get(rec.id, [])
            if sweeps.is_sweep(rec) or autoscaling.is_scaling(rec) or any(  # Job's, Deployment's
                    (p.status.phase if p.status else None) in ("Succeeded", "Failed") for p in pods):
                continue
            have = {int((p.metadata.labels or {}).get(wd.POD_INDEX, -1)) for p in pods}
            missing = [i for i in range(rec.workers) if i not in have]
            if not missing or time.time() - wd.created_at(g) < 2.0:
                continue
            if rec.on_eviction == "fail":
                reason = f"{len(missing)} pod(s) were evicted or deleted (onEviction: fail)"
                self.client.patch(PodGroupResource, rec.name, {"metadata": {"annotations": {
                    wd.FAILED: reason}}}, namespace=rec.namespace, patch_type=PatchType.MERGE)
                for p in pods:
                    with contextlib.suppress(ApiError):
                        self.client.delete(Pod, p.metadata.name, namespace=rec.namespace)
                self._event(g, "Failed", reason, "Warning")
                continue
            n = self._create_pods(rec, g.metadata.uid, missing)
            if n:
                made += n
                self._event(g, "Requeued", f"{n} missing pod(s) created again")
        return made

    # -- pods: logs and exec ---------------------------------------------------------------------

    def _pod(self, workload_id: str, index: int) -> tuple[wd.Record, Any]:
        entry = self.workloads.find(workload_id, None)
        rec = entry.rec
        if entry.managed:
            for pod in entry.pods:
                if int((pod.metadata.labels or {}).get(wd.POD_INDEX, -1)) == index:
                    return rec, pod
        else:
            pods = sorted(entry.pods, key=lambda p: p.metadata.name)
            if 0 <= index < len(pods):
                return rec, pods[index]
        raise NotFound(f"workload {rec.name} has no pod {index} now")

    def logs(self, workload_id: str, pod: int, offset: int) -> tuple[bytes, int]:
        rec, obj = self._pod(workload_id, pod)
        try:
            text = "".join(self.client.log(obj.metadata.name, namespace=rec.namespace,
                                           container=wd.CONTAINER))
        except ApiError as exc:
            raise Upstream(self._kubelet_error("logs", obj, api_message(exc), api_status(exc))) from None
        data = text.encode()
        return data[offset:], max(offset, len(data))

    def _kubelet_error(self, what: str, pod: Any, message: str, status: int | None) -> str:
        name = f"{pod.metadata.namespace}/{pod.metadata.name}"
        if status is not None and status < 500:
            return f"{what} of pod {name}: the API server refused: {message}"
        node = pod.spec.nodeName if pod.spec else None
        hint = ""
        if node:
            with contextlib.suppress(ApiError):
                n = self.client.get(Node, node)
                ann = n.metadata.annotations or {}
                if ann.get("kwok.x-k8s.io/node") == "fake" or \
                        (n.metadata.labels or {}).get(SIMULATED_LABEL) == "true":
                    hint = (f"; node {node} is simulated (kwok): no container runs there, so "
                            f"there is nothing to {'read' if what == 'logs' else 'run in'}")
        return (f"{what} of pod {name}: the API server could not reach the node's kubelet "
                f"({message}){hint}")

    def pods(self, workload_id: str) -> list[dict[str, Any]]:
        nodes, uuids, _, _ = self._nodes()
        doc = self.workloads.doc(self.workloads.find(workload_id, None), nodes, uuids, brief=False,
                                 events=False)
        pods: list[dict[str, Any]] = doc["pods"]
        return pods

    def exec_command(self, workload_id: str, pod: int, command: list[str],
                     timeout: float) -> dict[str, Any]:
        from tessera.kube.pod_exec import ExecError, pod_exec

        rec, obj = self._pod(workload_id, pod)
        if not (obj.spec and obj.spec.nodeName):
            raise Conflict(f"pod {rec.namespace}/{obj.metadata.name} is not bound to a node yet")
        try:
            return pod_exec(self.client, rec.namespace, obj.metadata.name, wd.CONTAINER, command,
                            timeout)
        except ExecError as exc:
            if exc.status is None:
                raise Upstream(f"exec in pod {rec.namespace}/{obj.metadata.name}: {exc}") from None
            raise Upstream(self._kubelet_error("exec", obj, str(exc), exc.status)) from None


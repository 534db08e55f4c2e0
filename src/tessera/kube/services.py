"""A workload's ports on the Kubernetes backend: ``tessera workspace submit NAME --port 8888
[--external-url]`` (REST ``spec.ports[i]``, ``spec.ports[i].externalUrl``).

``--port`` makes a ``Service`` named after the workload (ClusterIP, selecting the workload's pods
by ``tessera.io/workload-id``, port = the host port of ``--port HOST:CONTAINER``, default the
container port, targetPort = the container port), owned by the workload's PodGroup so the garbage
collector removes it with the workload. Its URL, ``http://NAME.NAMESPACE.svc.cluster.local:PORT``,
is what pods in the cluster reach.

``--external-url`` adds an ``Ingress`` (also owned by the PodGroup) when the API server has an
ingress configured: ``TESSERA_INGRESS_CLASS`` (the cluster's IngressClass) and
``TESSERA_INGRESS_DOMAIN`` (a wildcard DNS name pointing at that ingress controller), chart values
``api.workloadIngress.className``/``.domain``/``.scheme``. The host is
``NAME-NAMESPACE.DOMAIN`` (``NAME-PORT-NAMESPACE.DOMAIN`` for each port when several ask for a
URL) and the URL ``SCHEME://HOST`` (``TESSERA_INGRESS_SCHEME``, default ``https``: the controller
terminates TLS with a wildcard certificate; ``http`` otherwise). With no ingress configured,
``--external-url`` is refused naming the flag, before anything is made.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightkube import Client

from tessera.api.backend import WorkloadSubmission
from tessera.core.errors import InvalidRequest
from tessera.kube import workload_docs as wd

URLS = "_serviceUrls"
"""Where the record keeps the URLs made at submit (shown by list and describe)."""


@dataclass(frozen=True)
class IngressSettings:
    class_name: str
    domain: str
    scheme: str = "https"

    @classmethod
    def from_env(cls) -> IngressSettings | None:
        name = os.environ.get("TESSERA_INGRESS_CLASS", "").strip()
        domain = os.environ.get("TESSERA_INGRESS_DOMAIN", "").strip().strip(".")
        if not name or not domain:
            return None
        return cls(name, domain, os.environ.get("TESSERA_INGRESS_SCHEME", "https").strip()
                   or "https")


def _port(p: dict[str, Any]) -> int:
    return int(p.get("external") or p["container"])


def plan(spec: dict[str, Any], name: str, namespace: str,
         ingress: IngressSettings | None) -> tuple[list[str], list[tuple[str, int]]]:
    """(URLs, [(ingress host, service port)]) of a submission's ports; the refusal, naming the
    field, of an external URL the cluster cannot give."""
    ports = list(spec.get("ports") or [])
    seen: set[int] = set()
    for i, p in enumerate(ports):
        if _port(p) in seen:
            raise InvalidRequest(f"spec.ports[{i}]", "two ports use the same service port",
                                 _port(p))
        seen.add(_port(p))
    urls = [wd.service_url(name, namespace, _port(p)) for p in ports]
    external = [(i, p) for i, p in enumerate(ports) if p.get("externalUrl")]
    hosts: list[tuple[str, int]] = []
    for i, p in external:
        if ingress is None:
            raise InvalidRequest(
                f"spec.ports[{i}].externalUrl", "this cluster has no ingress for workloads: "
                "the API server needs TESSERA_INGRESS_CLASS and TESSERA_INGRESS_DOMAIN (chart "
                "values api.workloadIngress.className and .domain); without them the port is "
                "reached in the cluster at its Service's URL (--port alone)")
        label = f"{name}-{namespace}" if len(external) == 1 else \
            f"{name}-{_port(p)}-{namespace}"
        if len(label) > 63:
            raise InvalidRequest(f"spec.ports[{i}].externalUrl", "the URL's host name "
                                 f"{label}.{ingress.domain} would be longer than 63 characters "
                                 "before the domain: use a shorter workload name", label)
        hosts.append((f"{label}.{ingress.domain}", _port(p)))
        urls.append(f"{ingress.scheme}://{label}.{ingress.domain}")
    return urls, hosts


def build_service(rec: wd.Record, owner_uid: str) -> dict[str, Any]:
    ports = (rec.spec or {}).get("ports") or []
    return {"apiVersion": "v1", "kind": "Service", "metadata": wd.owned_meta(rec, owner_uid),
            "spec": {"type": "ClusterIP", "selector": {wd.WORKLOAD_ID: rec.id},
                     "ports": [{"name": f"p{_port(p)}", "protocol": "TCP", "port": _port(p),
                                "targetPort": int(p["container"])} for p in ports]}}


def build_ingress(rec: wd.Record, owner_uid: str, ingress: IngressSettings,
                  hosts: list[tuple[str, int]]) -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": wd.owned_meta(rec, owner_uid),
            "spec": {"ingressClassName": ingress.class_name, "rules": [
                {"host": host, "http": {"paths": [{
                    "path": "/", "pathType": "Prefix",
                    "backend": {"service": {"name": rec.name, "port": {"number": port}}}}]}}
                for host, port in hosts]}}


def create(client: Client, rec: wd.Record, owner_uid: str,
           ingress: IngressSettings | None) -> None:
    """The Service (and Ingress) of a workload with ports; nothing for one without."""
    if not (rec.spec or {}).get("ports"):
        return
    from lightkube.resources.core_v1 import Service
    from lightkube.resources.networking_v1 import Ingress

    service: Service = Service.from_dict(build_service(rec, owner_uid))  # type: ignore[assignment]
    client.create(service, namespace=rec.namespace)
    _, hosts = plan(rec.spec or {}, rec.name, rec.namespace, ingress)
    if hosts and ingress is not None:
        obj: Ingress = Ingress.from_dict(  # type: ignore[assignment]
            build_ingress(rec, owner_uid, ingress, hosts))
        client.create(obj, namespace=rec.namespace)


def urls(s: WorkloadSubmission, namespace: str) -> list[str]:
    """The URLs of a submission's ports, or the refusal naming the field."""
    return plan(s.spec, s.name, namespace, IngressSettings.from_env())[0]


def make(client: Client, rec: wd.Record, owner_uid: str,
         create_pods: Callable[[], object]) -> None:
    """What a submitted workload is made of, besides its PodGroup: an inference that scales is
    a Deployment and its Service (tessera.kube.autoscaling); a sweep, an Indexed Job
    (tessera.kube.sweeps); anything else, its pods (``create_pods``); then the Service (and
    Ingress) of its ports."""
    from tessera.kube import autoscaling, sweeps

    if autoscaling.is_scaling(rec):
        autoscaling.create(client, rec, owner_uid)
        return
    if sweeps.is_sweep(rec):
        sweeps.create_job(client, rec, owner_uid)
    else:
        create_pods()
    create(client, rec, owner_uid, IngressSettings.from_env())


def suspend(client: Client, rec: wd.Record, on: bool) -> bool:
    """Suspend or resume what a controller runs for the workload (a sweep's Job, a scaling
    inference's Deployment); False when its pods are tessera's own to delete and create."""
    from tessera.kube import autoscaling, sweeps

    return sweeps.suspend_job(client, rec, on) or autoscaling.suspend(client, rec, on)

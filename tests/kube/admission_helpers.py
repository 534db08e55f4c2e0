"""Pods as Run:ai, cGPU and plain Kubernetes write them, and the project namespaces the webhook
admits them in (shared by the admission, node and console tests)."""

from __future__ import annotations

import contextlib
import copy
import time
from typing import Any

import pytest
from lightkube import ApiError, Client, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod

from tessera.kube.objects import ProjectResource

SYSTEM_NS = "tessera-system"


def runai_pod(name: str, annotations: dict[str, str], **container: Any) -> dict[str, Any]:
    """A pod as Run:ai's CLI v1 submits it (``runai submit NAME -i IMAGE -g 0.5``): the share
    as an annotation, Run:ai's scheduler name, the project label."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"project": "team-a", "release": name},
                     "annotations": annotations},
        "spec": {
            "schedulerName": "runai-scheduler",
            "restartPolicy": "Never",
            "containers": [{"name": name, "image": "runai.jfrog.io/demo/quickstart", **container}],
        },
    }


def plain_pod(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": "busybox"}], **spec}}


def create_project_namespace(client: Client, base: str) -> tuple[str, str]:
    ns = f"{base}-{next(_seq)}"
    client.create(Namespace(metadata=ObjectMeta(name=ns)))
    project = f"{ns}-proj"
    client.create(ProjectResource(metadata=ObjectMeta(name=project), spec={
        "namespace": ns, "resources": {"gpu": {"deserved": 4}}}))
    return ns, project


def wait_webhook_sees_project(client: Client, ns: str) -> None:
    """The webhook learns Projects through a watch: wait until a dry-run is no longer refused
    for want of a project."""
    probe = codecs.from_dict(runai_pod("probe", {"gpu-fraction": "0.5"}))
    deadline = time.monotonic() + 15
    while True:
        try:
            client.create(probe, namespace=ns, dry_run=True)
            return
        except ApiError as exc:
            if "belongs to no tessera Project" not in str(exc.status.message) \
                    or time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def delete_pods(client: Client, ns: str) -> None:
    for pod in client.list(Pod, namespace=ns):
        with contextlib.suppress(ApiError):
            client.delete(Pod, pod.metadata.name, namespace=ns, grace_period=0)
    deadline = time.monotonic() + 30
    while list(client.list(Pod, namespace=ns)) and time.monotonic() < deadline:
        time.sleep(0.1)


def create(client: Client, manifest: dict[str, Any], ns: str) -> Any:
    return client.create(codecs.from_dict(copy.deepcopy(manifest)), namespace=ns)


def refused(client: Client, manifest: dict[str, Any], ns: str) -> str:
    with pytest.raises(ApiError) as info:
        create(client, manifest, ns)
    return str(info.value.status.message)


def _cgpu(count: str | None, mem: Any) -> dict[str, Any]:
    pod = plain_pod("bad", containers=[{"name": "main", "image": "x", "resources": {
        "limits": {"aliyun.com/gpu-mem": mem}} if mem is not None else {}}])
    if count is not None:
        pod["metadata"]["labels"] = {"aliyun.com/gpu-count": count}
    return pod


_seq = iter(range(10**6))

"""The objects ``bench.kube`` creates: one-GPU and half-GPU pods (a share of them constrained
through the predicates: nodeSelector, node affinity, tolerations, hostname anti-affinity), and
the ResourceClaims and pods of its DRA runs."""

from __future__ import annotations

from typing import Any

import msgspec
from lightkube.models.core_v1 import (
    Affinity,
    Container,
    NodeAffinity,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodAffinityTerm,
    PodAntiAffinity,
    PodSpec,
    PreferredSchedulingTerm,
    ResourceRequirements,
    Toleration,
)
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.resources.core_v1 import Pod

from tessera.kube import names

_encode = msgspec.json.Encoder().encode

CONSTRAINT_KINDS = ("nodeSelector", "affinity", "tolerations", "anti-affinity")


def constraint_fields(kind: str, i: int) -> tuple[dict[str, str], dict[str, Any]]:
    """(labels, spec fields) of a constrained pod: satisfiable on every simulated node, so the
    cluster still fills up, but each one goes through the predicates."""
    if kind == "nodeSelector":
        return {}, {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                     "type": "kwok"}}
    if kind == "affinity":
        return {}, {"affinity": node_affinity(i)}
    if kind == "tolerations":
        return {}, {"tolerations": [Toleration(key="dedicated", operator="Equal", value="gpu",
                                               effect="NoSchedule"),
                                    Toleration(key="node.kubernetes.io/unreachable", operator="Exists",
                                               effect="NoExecute", tolerationSeconds=300)]}
    group = f"g{i % 50}"
    return {"app": group}, {"affinity": Affinity(podAntiAffinity=PodAntiAffinity(
        requiredDuringSchedulingIgnoredDuringExecution=[PodAffinityTerm(
            labelSelector=LabelSelector(matchLabels={"app": group}),
            topologyKey="kubernetes.io/hostname")]))}


def node_affinity(i: int) -> Affinity:
    return Affinity(nodeAffinity=NodeAffinity(
        requiredDuringSchedulingIgnoredDuringExecution=NodeSelector(nodeSelectorTerms=[
            NodeSelectorTerm(matchExpressions=[NodeSelectorRequirement(
                key="nvidia.com/gpu.memory", operator="Gt", values=["40000"])])]),
        preferredDuringSchedulingIgnoredDuringExecution=[PreferredSchedulingTerm(
            weight=10, preference=NodeSelectorTerm(matchExpressions=[NodeSelectorRequirement(
                key="kubernetes.io/hostname", operator="NotIn", values=[f"gpu-node-{i % 7}"])]))]))


def pod(ns: str, name: str, whole: bool, constraint: str | None = None, i: int = 0) -> Pod:
    labels, extra = constraint_fields(constraint, i) if constraint else ({}, {})
    return Pod(
        metadata=ObjectMeta(name=name, namespace=ns, labels=labels or None,
                            annotations=None if whole else {names.GPU_PORTION: "0.5"}),
        spec=PodSpec(schedulerName=names.SCHEDULER_NAME, containers=[Container(
            name="main", image="example.invalid/train:1",
            resources=ResourceRequirements(limits={names.GPU_RESOURCE: "1"}) if whole else None,
        )], **extra),
    )


def claim_body(ns: str, name: str, whole: bool) -> dict[str, Any]:
    exactly: dict[str, Any] = ({"deviceClassName": "gpu.tessera.io"} if whole else
                               {"deviceClassName": "share.gpu.tessera.io",
                                "capacity": {"requests": {"shares": "50"}}})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def claim_pod_body(ns: str, name: str, claim: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"schedulerName": names.SCHEDULER_NAME,
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                     "containers": [{"name": "main", "image": "example.invalid/train:1",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


def kind_of(i: int, fraction: float) -> str | None:
    """Every pod i with (i mod 100) < fraction*100 is constrained, kinds in turn."""
    if (i % 100) >= round(fraction * 100):
        return None
    return CONSTRAINT_KINDS[i % len(CONSTRAINT_KINDS)]


def bodies(pods: list[Pod]) -> list[tuple[str, bytes]]:
    """(path, JSON body) of each pod's create, encoded once before the timed window (as
    kube-scheduler's scheduler_perf builds its pods from a template before it creates them)."""
    return [(f"/api/v1/namespaces/{p.metadata.namespace}/pods",
             _encode({"apiVersion": "v1", "kind": "Pod", **p.to_dict()}))
            for p in pods if p.metadata is not None]

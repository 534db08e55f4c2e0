"""The webhook's rewrite of old-style GPU requests into ResourceClaims (``dra.rewriteRequests``,
issue 19 item 4), on the real API server: webhook and tessera-scheduler run as the chart's
ServiceAccounts with the chart's RBAC rendered with the value on. A Run:ai ``gpu-fraction`` pod,
a ``gpu-memory`` (MiB) pod, a cGPU ``aliyun.com/gpu-mem`` pod and a 2 x ``nvidia.com/gpu`` pod
are admitted with a claim from the template of their shape (created by the webhook in the
pod's namespace), then — the test playing kube-controller-manager's resourceclaim controller,
which the test cluster does not run — allocated by tessera-scheduler and bound. A template
that cannot be created refuses the pod; a dry run creates none."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import ApiError, Client, codecs
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.admissionregistration_v1 import (
    ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
)
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from tessera.core.model import GpuRequest
from tessera.core.units import parse_memory
from tessera.kube.admission import claims
from tessera.kube.claims import ResourceClaim
from tessera.testing import webhook as local
from tessera.testing.cluster import TestCluster
from tests.kube.admission_helpers import (
    SYSTEM_NS,
    create,
    create_project_namespace,
    delete_pods,
    refused,
    runai_pod,
    wait_webhook_sees_project,
)
from tests.kube.rbac_helpers import allowed
from tests.waiting import wait_until

ON = "dra.rewriteRequests=true"
Template = create_namespaced_resource("resource.k8s.io", "v1", "ResourceClaimTemplate",
                                      "resourceclaimtemplates")


def _rbac(*sets: str) -> list[dict[str, Any]]:
    return [d for d in local.helm_template(*sets) if d["kind"] in (
        "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]


@pytest.fixture(scope="module")
def stack(kube_cluster: TestCluster) -> Iterator[TestCluster]:
    local.apply(kube_cluster, [d for d in local.helm_template(include_crds=True)
                               if d["kind"] == "CustomResourceDefinition"])
    kube_cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                         "crd/projects.tessera.io", "crd/podgroups.tessera.io")
    sched_kc = kube_cluster.service_account_kubeconfig(SYSTEM_NS, "tessera-scheduler")
    hook_kc = kube_cluster.service_account_kubeconfig(SYSTEM_NS, "tessera-webhook")
    local.apply(kube_cluster, _rbac(ON))
    assert kube_cluster.workdir is not None
    log = (kube_cluster.workdir / "logs" / "claims-scheduler.log").open("ab")
    sched = subprocess.Popen(
        [sys.executable, "-m", "tessera.kube.scheduler", f"--kubeconfig={sched_kc}",
         "--lease-name=tessera-scheduler-claims-rewrite", "--lease-duration=3",
         "--identity=claims-rewrite"], stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL)
    hook = local.start_webhook(kube_cluster, name="claims-webhook", kubeconfig=hook_kc,
                               extra_args=["--rewrite-to-claims"])
    try:
        local.register(kube_cluster, hook, ON)
        yield kube_cluster
    finally:
        local.unregister(kube_cluster)
        hook.stop()
        sched.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            sched.wait(10)
        if sched.poll() is None:
            sched.kill()
        log.close()
        local.apply(kube_cluster, _rbac())  # the default chart's RBAC for later modules


@pytest.fixture(scope="module")
def ns(stack: TestCluster, kube_client: Client) -> Iterator[str]:
    name, _ = create_project_namespace(kube_client, "rewrite")
    wait_webhook_sees_project(kube_client, name)
    yield name
    delete_pods(kube_client, name)


def _share(cap: dict[str, str], count: int = 1) -> dict[str, Any]:
    return {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "share.gpu.tessera.io", "allocationMode": "ExactCount",
        "count": count, "capacity": {"requests": cap}}}]}}


def _pods() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod as written the old way, the claim spec its template must hold)."""
    cgpu = runai_pod("cgpu", {})
    cgpu["metadata"]["labels"]["aliyun.com/gpu-count"] = "2"
    cgpu["spec"]["containers"][0]["resources"] = {"limits": {"aliyun.com/gpu-mem": 8}}
    whole = runai_pod("whole", {})
    whole["spec"]["schedulerName"] = "tessera"
    whole["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 2}}
    return [
        (runai_pod("frac", {"gpu-fraction": "0.5"}), _share({"shares": "50"})),
        (runai_pod("mem", {"gpu-memory": "5000"}), _share({"memory": "5000Mi"})),
        (cgpu, _share({"memory": "4Gi"}, count=2)),
        (whole, {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.tessera.io", "allocationMode": "ExactCount", "count": 2}}]}}),
    ]


def _make_claim(client: Client, ns: str, pod: Pod, template: dict[str, Any]) -> str:
    """What kube-controller-manager's resourceclaim controller does for a pod naming a
    template: the claim (owned by the pod) and its name in the pod's status."""
    assert pod.metadata is not None
    name = f"{pod.metadata.name}-tessera-gpu-x1y2z"
    client.create(codecs.from_dict({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns,
                     "annotations": {"resource.kubernetes.io/pod-claim-name": "tessera-gpu"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
                                          "name": pod.metadata.name, "uid": pod.metadata.uid,
                                          "controller": True}]},
        "spec": template["spec"]["spec"]}))
    client.patch(Pod.Status, pod.metadata.name, {"status": {"resourceClaimStatuses": [
        {"name": "tessera-gpu", "resourceClaimName": name}]}}, namespace=ns,
        patch_type=PatchType.MERGE)
    return name


def test_old_style_pods_get_claims_that_tessera_allocates(kube_client: Client, ns: str) -> None:
    made = []
    for manifest, expected in _pods():
        pod = create(kube_client, manifest, ns)
        name = pod.metadata.name
        # the claim, and nothing of the annotation path
        (entry,) = pod.spec.resourceClaims
        assert entry.name == "tessera-gpu" and entry.resourceClaimTemplateName.startswith(
            "tessera-gpu-"), name
        c = pod.spec.containers[0]
        assert [x.name for x in c.resources.claims] == ["tessera-gpu"], name
        assert not set(c.resources.limits or {}) & {"nvidia.com/gpu", "aliyun.com/gpu-mem"}
        assert not [e for e in c.env or [] if e.valueFrom or e.name.startswith(
            ("NVIDIA_", "TESSERA_"))], f"{name}: {c.env}"
        assert not c.volumeMounts and not pod.spec.volumes, name
        assert pod.spec.schedulerName == "tessera"
        assert not {"gpu-fraction", "gpu-memory", "tessera.io/gpu-portion",
                    "tessera.io/gpu-memory"} & set(pod.metadata.annotations), name
        # the template of its shape, made by the webhook in the pod's namespace
        template = kube_client.get(Template, entry.resourceClaimTemplateName,
                                   namespace=ns).to_dict()
        assert claims.same_spec(template["spec"]["spec"], expected), (name, template)
        made.append((pod, template))
    claim_names = [_make_claim(kube_client, ns, pod, t) for pod, t in made]
    for (pod, _), claim in zip(made, claim_names, strict=True):
        name = pod.metadata.name
        wait_until(f"{name} bound", lambda n=name: kube_client.get(  # type: ignore[misc]
            Pod, n, namespace=ns).spec.nodeName)
        st = kube_client.get(ResourceClaim, claim, namespace=ns).to_dict()["status"]
        results = st["allocation"]["devices"]["results"]
        assert st["reservedFor"][0]["uid"] == pod.metadata.uid
        consumed = [{k: 0 if v == "0" else parse_memory(v, k)
                     for k, v in r["consumedCapacity"].items()}
                    for r in results]
        if name == "frac":
            assert [c["shares"] for c in consumed] == [50]
        elif name == "mem":
            assert [c["memory"] for c in consumed] == [5000 * 2**20]
        elif name == "cgpu":
            assert [c["memory"] for c in consumed] == [4 * 2**30] * 2
            assert len({r["device"] for r in results}) == 2
        else:
            assert len({r["device"] for r in results}) == 2 and all(
                c["shares"] == 100 for c in consumed)
    # the same shape again: the same template, nothing new
    again = create(kube_client, {**runai_pod("frac-2", {"gpu-fraction": "0.5"})}, ns)
    assert again.spec.resourceClaims[0].resourceClaimTemplateName == \
        made[0][0].spec.resourceClaims[0].resourceClaimTemplateName
    assert len(list(kube_client.list(Template, namespace=ns))) == 4


def test_a_dry_run_creates_no_template(kube_client: Client, ns: str) -> None:
    name = claims.template_for(GpuRequest.fraction("0.37")).name
    pod = kube_client.create(codecs.from_dict(runai_pod("dry", {"gpu-fraction": "0.37"})),
                             namespace=ns, dry_run=True)
    assert pod.spec.resourceClaims[0].resourceClaimTemplateName == name
    with pytest.raises(ApiError) as info:
        kube_client.get(Template, name, namespace=ns)
    assert info.value.status.code == 404


def test_a_pod_whose_template_cannot_be_made_is_refused(kube_client: Client, ns: str) -> None:
    # someone else's template under the name of the shape, asking for something else
    name = claims.template_for(GpuRequest.fraction("0.41")).name
    kube_client.create(codecs.from_dict({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"spec": _share({"shares": "100"})}}))
    msg = refused(kube_client, runai_pod("taken", {"gpu-fraction": "0.41"}), ns)
    assert f"spec.resourceClaims: ResourceClaimTemplate {ns}/{name} (the claim the webhook " \
           "rewrites this GPU request into) exists and asks for something else" in msg, msg
    # a namespace where the API server refuses every template (an admission policy)
    other, _ = create_project_namespace(kube_client, "rewrite-nowhere")
    kube_client.create(codecs.from_dict({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "no-templates"},
        "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [{
            "apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE"],
            "resources": ["resourceclaimtemplates"]}]},
            "validations": [{"expression": "false", "message": "no templates here"}]}}))
    kube_client.create(codecs.from_dict({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": "no-templates"},
        "spec": {"policyName": "no-templates", "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {
                     "kubernetes.io/metadata.name": other}}}}}))
    probe = codecs.from_dict({"apiVersion": "resource.k8s.io/v1",
                              "kind": "ResourceClaimTemplate", "metadata": {"name": "probe"},
                              "spec": {"spec": _share({"shares": "1"})}})

    def policy_in_force() -> bool:  # a new policy takes effect a moment after it is stored
        try:
            kube_client.create(probe, namespace=other, dry_run=True)
        except ApiError as exc:
            return "no templates here" in str(exc.status.message)
        return False

    try:
        wait_until("the policy refuses templates", policy_in_force)
        wait_webhook_sees_project(kube_client, other)  # its probe is a dry run: no template
        msg = refused(kube_client, runai_pod("nowhere", {"gpu-fraction": "0.5"}), other)
    finally:
        kube_client.delete(ValidatingAdmissionPolicyBinding, "no-templates")
        kube_client.delete(ValidatingAdmissionPolicy, "no-templates")
    assert f"ResourceClaimTemplate {other}/" in msg and "could not be created (" in msg \
        and "no templates here" in msg and "the pod is refused rather than started without " \
        "its GPU" in msg, msg
    for n in (ns, other):
        names = [p.metadata.name for p in kube_client.list(Pod, namespace=n)]
        assert not {"taken", "nowhere"} & set(names)


def test_bad_and_mixed_requests_are_refused_naming_the_field(kube_client: Client,
                                                             ns: str) -> None:
    msg = refused(kube_client, runai_pod("bad", {"gpu-fraction": "1.5"}), ns)
    assert "metadata.annotations[gpu-fraction]: must be a decimal GPU portion in (0, 1)" in msg
    msg = refused(kube_client, runai_pod("limit", {"gpu-fraction": "0.5",
                                                   "gpu-fraction-limit": "0.8"}), ns)
    assert "metadata.annotations[gpu-fraction-limit]: a GPU limit above the request cannot " \
           "be written in a ResourceClaim" in msg, msg
    mixed = runai_pod("mixed", {"gpu-memory": "2000"})
    mixed["spec"]["resourceClaims"] = [{"name": "mine", "resourceClaimName": "mine"}]
    mixed["spec"]["containers"][0]["resources"] = {"claims": [{"name": "mine"}]}
    msg = refused(kube_client, mixed, ns)
    assert "spec.resourceClaims: a pod asking for GPUs the old way (metadata.annotations" \
           "[gpu-memory]) must not name ResourceClaims of its own as well" in msg, msg


def test_the_webhook_may_create_templates_and_nothing_more(stack: TestCluster,
                                                           kube_client: Client) -> None:
    """The chart's RBAC with the value on: get and create ResourceClaimTemplates in any
    namespace; no list, update, patch or delete, and no claims."""
    group = "resource.k8s.io"
    for verb in ("get", "create"):
        assert allowed(kube_client, "tessera-webhook", verb, "resourceclaimtemplates",
                       "some-team", group)
    for verb in ("list", "watch", "update", "patch", "delete"):
        assert not allowed(kube_client, "tessera-webhook", verb, "resourceclaimtemplates",
                           "some-team", group), verb
    for verb in ("get", "create"):
        assert not allowed(kube_client, "tessera-webhook", verb, "resourceclaims",
                           "some-team", group), verb

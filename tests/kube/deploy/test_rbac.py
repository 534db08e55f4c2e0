"""Least privilege of the chart's ServiceAccounts, checked by the real API server: the chart's
RBAC and ValidatingAdmissionPolicies applied to the test cluster, then every rule a component
needs is allowed (SubjectAccessReview, what ``kubectl auth can-i --as`` asks), what it must not
do is refused, and the admission policies are exercised with real requests made with each
account's own token (docs/robustness.md, "Least privilege")."""

from __future__ import annotations

import ssl
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from lightkube import ApiError, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Namespace, Pod

from tessera.testing import webhook as local
from tessera.testing.cluster import TestCluster
from tests.kube.rbac_helpers import NS, allowed

RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
              "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
ACCOUNTS = ("tessera-scheduler", "tessera-webhook", "tessera-api", "tessera-node-agent")
USER_NS = "rbac-team"          # a project's namespace (labelled tessera.io/project)
OTHER_NS = "rbac-elsewhere"    # any other namespace (kube-system stands for it too)


@pytest.fixture(scope="module")
def chart_rbac(kube_cluster: TestCluster) -> dict[tuple[str, str], dict[str, Any]]:
    """The chart's ServiceAccounts, roles, bindings and admission policies, applied for real."""
    docs = [d for d in local.helm_template() if d["kind"] in RBAC_KINDS]
    kube_cluster.kubectl("create", "namespace", NS, check=False)
    local.apply(kube_cluster, docs)
    admin = kube_cluster.client()
    for name, labels in ((USER_NS, {"tessera.io/project": USER_NS}), (OTHER_NS, {})):
        try:
            admin.create(Namespace(metadata=ObjectMeta(name=name, labels=labels)))
        except ApiError as exc:
            if exc.status.code != 409:
                raise
    # A new admission policy takes effect a moment after it is stored: wait until it refuses.
    api = kube_cluster.client(kube_cluster.service_account_kubeconfig(NS, "tessera-api",
                                                                      create=False))
    deadline = time.monotonic() + 30
    while True:
        _, msg = _status(lambda: api.create(_pod("rbac-probe"), namespace=OTHER_NS,
                                            dry_run=True))
        if "tessera-api acts only" in msg or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def test_every_rule_a_component_needs_is_granted(
        kube_cluster: TestCluster, chart_rbac: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Each verb of each role is allowed where the component uses it: ClusterRole rules in a
    project's namespace (and cluster-wide), Role rules in the release namespace."""
    admin = kube_cluster.client()
    checked = 0
    for (kind, _), doc in chart_rbac.items():
        if kind not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        account = doc["subjects"][0]["name"]
        role = chart_rbac[(doc["roleRef"]["kind"], doc["roleRef"]["name"])]
        where = NS if kind == "RoleBinding" else USER_NS
        for rule in role["rules"]:
            for group in rule.get("apiGroups", [""]):
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames") or [None]:
                            assert allowed(admin, account, verb, resource, where, group,
                                           name), (account, verb, group, resource, where, name)
                            checked += 1
    assert checked > 60


# (account, verb, resource, namespace, group): each must be refused by RBAC.
FORBIDDEN = [
    # Nobody reads Secrets (the webhook's certificate is a mounted volume).
    *[(a, v, "secrets", ns, "") for a in ACCOUNTS for v in ("get", "list", "watch")
      for ns in (NS, USER_NS, "kube-system")],
    # Nobody runs commands in pods of the control plane or of kube-system...
    *[(a, "create", sub, ns, "") for a in ("tessera-scheduler", "tessera-webhook",
                                           "tessera-node-agent")
      for sub in ("pods/exec", "pods/attach", "pods/portforward") for ns in (NS, "kube-system")],
    # ...nor grants itself more.
    *[(a, v, r, ns, "rbac.authorization.k8s.io") for a in ACCOUNTS
      for v, r in (("create", "rolebindings"), ("create", "clusterrolebindings"),
                   ("escalate", "roles"), ("bind", "clusterroles"))
      for ns in (NS, USER_NS)
      # the API writes access rules' RoleBindings (confined to project namespaces by its
      # admission policy, and able to bind only admin, edit and view: tested below)
      if not (a == "tessera-api" and r == "rolebindings")],
    *[(a, "create", "serviceaccounts/token", NS, "") for a in ACCOUNTS],
    *[(a, "update", "validatingadmissionpolicies", None, "admissionregistration.k8s.io")
      for a in ACCOUNTS],
    # The scheduler creates pods (reservation pods) in the release namespace only; it does not
    # create namespaces (the release namespace exists) or change nodes.
    ("tessera-scheduler", "create", "pods", USER_NS, ""),
    ("tessera-scheduler", "create", "pods", "kube-system", ""),
    ("tessera-scheduler", "create", "namespaces", None, ""),
    ("tessera-scheduler", "delete", "namespaces", None, ""),
    ("tessera-scheduler", "patch", "nodes", None, ""),
    ("tessera-scheduler", "update", "pods", USER_NS, ""),
    ("tessera-scheduler", "create", "leases", USER_NS, "coordination.k8s.io"),
    ("tessera-scheduler", "update", "leases", "kube-system", "coordination.k8s.io"),
    # The webhook reads nodes and projects, and gets (never lists) a pod's owners.
    ("tessera-webhook", "list", "pods", USER_NS, ""),
    ("tessera-webhook", "list", "jobs", USER_NS, "batch"),
    ("tessera-webhook", "create", "pods", USER_NS, ""),
    ("tessera-webhook", "get", "configmaps", USER_NS, ""),
    ("tessera-webhook", "patch", "nodes", None, ""),
    ("tessera-webhook", "update", "projects", None, "tessera.io"),
    # The node agent patches pods only in the release namespace (reservation pods).
    ("tessera-node-agent", "patch", "pods", USER_NS, ""),
    ("tessera-node-agent", "delete", "pods", USER_NS, ""),
    ("tessera-node-agent", "create", "pods", NS, ""),
    ("tessera-node-agent", "delete", "nodes", None, ""),
    ("tessera-node-agent", "get", "configmaps", USER_NS, ""),
    # The API cannot label a namespace (that would hand it to a project: see the policy test),
    # nor touch ConfigMaps, nodes or the scheduler's Lease.
    ("tessera-api", "update", "namespaces", None, ""),
    ("tessera-api", "patch", "namespaces", None, ""),
    ("tessera-api", "create", "configmaps", USER_NS, ""),
    ("tessera-api", "delete", "configmaps", USER_NS, ""),
    ("tessera-api", "patch", "nodes", None, ""),
    ("tessera-api", "update", "leases", NS, "coordination.k8s.io"),
    ("tessera-api", "patch", "projects/status", None, "tessera.io"),
]


def test_components_cannot_do_what_they_should_not(
        kube_cluster: TestCluster, chart_rbac: dict[tuple[str, str], dict[str, Any]]) -> None:
    admin = kube_cluster.client()
    granted = [case for case in FORBIDDEN
               if allowed(admin, case[0], case[1], case[2], case[3], case[4])]
    assert granted == []
    # The same answer through kubectl, as an operator would ask it.
    out = kube_cluster.kubectl("auth", "can-i", "create", "pods", "-n", USER_NS,
                               f"--as=system:serviceaccount:{NS}:tessera-scheduler", check=False)
    assert out.stdout.strip() == "no"
    out = kube_cluster.kubectl("auth", "can-i", "create", "pods", "-n", NS,
                               f"--as=system:serviceaccount:{NS}:tessera-scheduler", check=False)
    assert out.stdout.strip() == "yes"


def _pod(name: str) -> Any:
    return codecs.from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                             "spec": {"containers": [{"name": "main", "image": "x"}]}})


def _status(call: Any) -> tuple[int, str]:
    try:
        call()
    except ApiError as exc:
        return exc.status.code or 0, str(exc.status.message)
    return 200, ""


def test_scheduler_creates_pods_only_in_the_release_namespace(
        kube_cluster: TestCluster, chart_rbac: dict[tuple[str, str], dict[str, Any]]) -> None:
    sched = kube_cluster.client(kube_cluster.service_account_kubeconfig(
        NS, "tessera-scheduler", create=False))
    admin = kube_cluster.client()
    code, msg = _status(lambda: sched.create(_pod("rbac-sched-elsewhere"), namespace=USER_NS))
    assert code == 403 and "cannot create resource \"pods\"" in msg, msg
    sched.create(_pod("rbac-sched-reservation"), namespace=NS)
    admin.delete(Pod, "rbac-sched-reservation", namespace=NS, grace_period=0)


def _exec(cluster: TestCluster, kubeconfig: Path, namespace: str, pod: str) -> str:
    """POST pods/exec with the account's token (kubectl exec would first need ``get pods``,
    which tessera-api has not); the API server's answer as text."""
    assert cluster.pki is not None
    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    r = httpx.post(f"{cluster.server}/api/v1/namespaces/{namespace}/pods/{pod}/exec",
                   params={"command": "true", "stdout": "true"},
                   headers={"Authorization": f"Bearer {token}"},
                   verify=ssl.create_default_context(cafile=str(cluster.pki.ca_cert)), timeout=10)
    return f"{r.status_code} {r.text}"


def test_api_acts_only_in_namespaces_of_projects(
        kube_cluster: TestCluster, chart_rbac: dict[tuple[str, str], dict[str, Any]]) -> None:
    """RBAC lets tessera-api create, delete and exec into pods anywhere (project namespaces
    come and go); the chart's admission policy holds it to namespaces labelled
    tessera.io/project, and to deleting only namespaces it created. Real requests with the
    account's own token."""
    kc = kube_cluster.service_account_kubeconfig(NS, "tessera-api", create=False)
    api = kube_cluster.client(kc)
    admin = kube_cluster.client()
    refusal = "tessera-api acts only in namespaces of tessera projects"
    # Pods: created in a project's namespace; refused in another and in kube-system.
    api.create(_pod("rbac-api-ok"), namespace=USER_NS)
    for ns in (OTHER_NS, "kube-system", NS):
        code, msg = _status(lambda ns=ns: api.create(_pod("rbac-api-no"), namespace=ns))
        assert code in (400, 403, 422) and refusal in msg, (ns, code, msg)
    # Deleting pods the same way (the one outside made by the admin).
    admin.create(_pod("rbac-victim"), namespace=OTHER_NS)
    code, msg = _status(lambda: api.delete(Pod, "rbac-victim", namespace=OTHER_NS))
    assert refusal in msg, (code, msg)
    assert admin.get(Pod, "rbac-victim", namespace=OTHER_NS).metadata is not None
    api.delete(Pod, "rbac-api-ok", namespace=USER_NS, grace_period=0)
    # exec: refused outside by the policy; inside, the request gets past admission (and then
    # fails only because the pod has no node: kwok runs nothing).
    assert refusal in _exec(kube_cluster, kc, OTHER_NS, "rbac-victim")
    admin.create(_pod("rbac-exec"), namespace=USER_NS)
    got = _exec(kube_cluster, kc, USER_NS, "rbac-exec")
    assert refusal not in got and "forbidden" not in got.lower(), got
    # Namespaces: deletes one it created for a project, not one someone else made.
    api.create(Namespace(metadata=ObjectMeta(
        name="rbac-api-own", labels={"tessera.io/project": "rbac-api-own"},
        annotations={"tessera.io/created-by": "tessera-api"})))
    api.delete(Namespace, "rbac-api-own")
    for ns in (USER_NS, OTHER_NS, NS):
        code, msg = _status(lambda ns=ns: api.delete(Namespace, ns))
        assert "tessera-api deletes only namespaces it created" in msg, (ns, code, msg)
        assert admin.get(Namespace, ns).status.phase != "Terminating"  # type: ignore[union-attr]
    # And it cannot make a namespace a project's by labelling it (RBAC: no patch).
    code, msg = _status(lambda: api.patch(Namespace, OTHER_NS, {"metadata": {"labels": {
        "tessera.io/project": "x"}}}))
    assert code == 403, msg


def test_only_the_scheduler_deletes_per_pod_configmaps(
        kube_cluster: TestCluster, chart_rbac: dict[tuple[str, str], dict[str, Any]]) -> None:
    """A user who may do anything with ConfigMaps in their namespace (as the ``edit`` role allows) cannot
    delete a pod's ``-tessera-gpu`` ConfigMap, one by one or all at once; their own ConfigMaps
    they can; the scheduler can. (Creating or changing one is refused by the webhook:
    tests/kube/admission/test_admission.py.)"""
    admin = kube_cluster.client()
    sched = kube_cluster.client(kube_cluster.service_account_kubeconfig(
        NS, "tessera-scheduler", create=False))
    ns = "rbac-cm"
    try:
        admin.create(Namespace(metadata=ObjectMeta(name=ns)))
    except ApiError as exc:
        if exc.status.code != 409:
            raise
    # (The built-in ``edit`` role is filled by kube-controller-manager, which the test cluster
    # does not run: this Role grants what ``edit`` grants on ConfigMaps.)
    kube_cluster.kubectl("create", "role", "cm-edit", "--verb=*", "--resource=configmaps",
                         "-n", ns, check=False)
    kube_cluster.kubectl("create", "rolebinding", "alice-edit", "--role=cm-edit",
                         "--user=alice", "-n", ns, check=False)
    labels = {"app.kubernetes.io/managed-by": "tessera", "tessera.io/pod": "train"}
    for name, lab in (("train-tessera-gpu", labels), ("legacy-tessera-gpu", {}),
                      ("labelled", labels), ("mine", {})):
        sched.create(ConfigMap(metadata=ObjectMeta(name=name, labels=lab),
                               data={"TESSERA_GPU_MEMORY_LIMIT": "8589934592"}), namespace=ns)
    as_alice = ("--as=alice", "-n", ns)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the policy takes effect a moment after it is stored
        out = kube_cluster.kubectl(*as_alice, "delete", "configmap", "labelled",
                                   "--dry-run=server", check=False)
        if "only tessera-scheduler deletes it" in out.stderr:
            break
        time.sleep(0.2)
    for name in ("train-tessera-gpu", "legacy-tessera-gpu", "labelled"):
        out = kube_cluster.kubectl(*as_alice, "delete", "configmap", name, check=False)
        assert out.returncode != 0 and "only tessera-scheduler deletes it" in out.stderr, \
            out.stderr
    out = kube_cluster.kubectl(*as_alice, "delete", "configmaps", "--all", check=False)
    assert "only tessera-scheduler deletes it" in out.stderr, out.stderr
    left = {c.metadata.name for c in admin.list(ConfigMap, namespace=ns)}
    assert {"train-tessera-gpu", "legacy-tessera-gpu", "labelled"} <= left
    assert "mine" not in left  # deleted by --all: alice's own ConfigMaps are hers
    sched.delete(ConfigMap, "train-tessera-gpu", namespace=ns)
    admin.delete(ConfigMap, "labelled", namespace=ns)  # a cluster admin still may
    left = {c.metadata.name for c in admin.list(ConfigMap, namespace=ns)}
    assert "train-tessera-gpu" not in left and "labelled" not in left


def test_api_rbac_file_carries_the_same_policy() -> None:
    """deploy/api-rbac.yaml (tessera up --kubernetes, the CLI tests) holds the chart's policy."""
    root = Path(__file__).resolve().parents[3]
    declared = {d["kind"]: d for d in yaml.safe_load_all((root / "deploy" / "api-rbac.yaml")
                                                         .read_text()) if d}
    chart = {(d["kind"], d["metadata"]["name"]): d for d in local.helm_template()}
    policy = chart[("ValidatingAdmissionPolicy", "tessera-api-project-namespaces")]
    assert declared["ValidatingAdmissionPolicy"]["spec"] == policy["spec"]


def test_api_binds_only_admin_edit_view_and_only_in_project_namespaces(
        kube_cluster: TestCluster, chart_rbac: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Access rules become RoleBindings (docs/tenancy.md): the API may bind tessera's three
    ClusterRoles, never cluster-admin or admin, and write RoleBindings only in namespaces of
    tessera projects (its admission policy), tried with its own token."""
    admin = kube_cluster.client()
    group = "rbac.authorization.k8s.io"
    for role in ("tessera-viewer", "tessera-researcher", "tessera-project-admin"):
        assert allowed(admin, "tessera-api", "bind", "clusterroles", None, group, role)
    for role in ("cluster-admin", "admin", "edit"):
        assert not allowed(admin, "tessera-api", "bind", "clusterroles", None, group, role)
    assert not allowed(admin, "tessera-api", "create", "clusterrolebindings", None, group)
    api = kube_cluster.client(kube_cluster.service_account_kubeconfig(NS, "tessera-api",
                                                                      create=False))

    def binding(role: str) -> Any:
        return codecs.from_dict({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": f"rbac-probe-{role}"},
            "roleRef": {"apiGroup": group, "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": group, "kind": "User", "name": "someone"}]})

    code, msg = _status(lambda: api.create(binding("tessera-researcher"), namespace=USER_NS,
                                           dry_run=True))
    assert code == 200, msg
    code, msg = _status(lambda: api.create(binding("tessera-researcher"), namespace=OTHER_NS,
                                           dry_run=True))
    assert code in (403, 422) and "tessera-api acts only" in msg
    code, _ = _status(lambda: api.create(binding("cluster-admin"), namespace=USER_NS,
                                         dry_run=True))
    assert code == 403

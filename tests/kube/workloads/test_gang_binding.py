"""A gang is bound whole or not at all, against the real API server (issue 32's partial gang).

The 64-pod benchmark once ended with 7 pods of a gang bound and 57 waiting: each member was
bound as soon as its own bind steps were done, so a member whose steps failed (or a scheduler
stopping between two members) left the gang half bound. Here one member's bind step is made to
fail by the API server itself (a ValidatingAdmissionPolicy refusing its ConfigMap): no member
may be bound until it succeeds (tessera.kube.bind.gang). And a member whose *binding* is refused
after the others were bound: the gang is evicted whole after the stale-gang grace
(tessera.kube.stale_gangs), instead of holding GPUs half started forever.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client, codecs
from lightkube.resources.core_v1 import Pod

from tessera.kube import names
from tessera.testing import webhook as local
from tessera.testing.cluster import TestCluster
from tessera.testing.workload_stack import (
    events_of,
    pods,
    project_namespace,
    scheduled_message,
    workload_stack,
)
from tests.waiting import wait_until

STALE_SECONDS = 4


@pytest.fixture(scope="module")
def stack() -> Iterator[TestCluster]:
    with workload_stack(controller_manager=False,
                        scheduler_args=[f"--stale-gang-seconds={STALE_SECONDS}"]) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(stack: TestCluster) -> Client:
    c: Client = stack.client()
    return c


def refuse(cluster: TestCluster, name: str, resource: str, expression: str) -> None:
    """A ValidatingAdmissionPolicy (and its binding) refusing CREATE of ``resource`` where
    ``expression`` is false."""
    local.apply(cluster, [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": name},
         "spec": {"failurePolicy": "Fail",
                  "matchConstraints": {"resourceRules": [{
                      "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                      "resources": [resource]}]},
                  "validations": [{"expression": expression,
                                   "message": f"refused by the test's policy {name}"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1",
         "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
         "spec": {"policyName": name, "validationActions": ["Deny"]}}])


def enforced(cluster: TestCluster, policy: str, *kubectl: str) -> None:
    """Wait until the API server enforces the policy just created (it loads policies through an
    informer): a dry-run request it must refuse is refused naming it."""
    def refused() -> bool:
        out = cluster.kubectl(*kubectl, check=False)
        return out.returncode != 0 and policy in out.stderr
    wait_until(f"policy {policy} enforced", refused, timeout=30, interval=0.3)


def allow(cluster: TestCluster, name: str) -> None:
    cluster.kubectl("delete", "validatingadmissionpolicybinding", name, "--ignore-not-found")
    cluster.kubectl("delete", "validatingadmissionpolicy", name, "--ignore-not-found")


def gang_pods(client: Client, ns: str, group: str, size: int) -> list[str]:
    podnames = [f"{group}-{i}" for i in range(size)]
    for name in podnames:
        client.create(codecs.from_dict({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {
                "tessera.io/gpu-portion": "0.5", names.POD_GROUP: group,
                names.GANG_MIN_MEMBER: str(size)}},
            "spec": {"schedulerName": "tessera",
                     "containers": [{"name": "c", "image": "busybox"}]}}), namespace=ns)
    return podnames


def bound_names(client: Client, ns: str) -> set[str]:
    return {p.metadata.name for p in pods(client, ns) if p.spec and p.spec.nodeName}


def failed_binding(client: Client, ns: str, name: str) -> Any:
    return next((e for e in events_of(client, ns, name) if e.reason == "FailedBinding"), None)


def test_gang_member_whose_bind_step_fails_keeps_the_whole_gang_unbound(
        stack: TestCluster, client: Client) -> None:
    ns, _ = project_namespace(client, "gang-barrier")
    # The last member's ConfigMap (its container's environment, a bind step before the
    # binding) is refused by the API server: that member cannot be bound.
    policy = "refuse-gang-configmap"
    refuse(stack, policy, "configmaps", f"!(request.namespace == '{ns}' && "
           "object.metadata.name == 'g-3-tessera-gpu')")
    enforced(stack, policy, "create", "configmap", "g-3-tessera-gpu", "-n", ns,
             "--dry-run=server")
    try:
        podnames = gang_pods(client, ns, "g", 4)
        wait_until("FailedBinding on g-3", lambda: failed_binding(client, ns, "g-3"),
                   timeout=60)
        # The others ran their steps too, but none may be bound; watch for a while (several
        # cycles and back-off retries).
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            assert bound_names(client, ns) == set(), "a member of a gang was bound alone"
            time.sleep(0.2)
        waiting = {p.metadata.name: scheduled_message(p) for p in pods(client, ns)}
        assert any("binding of its member" in waiting[n] and "g-3" in waiting[n]
                   for n in podnames if n != "g-3"), waiting
    finally:
        allow(stack, policy)
    # Once the member can be bound, all four are (together).
    wait_until("all 4 bound", lambda: bound_names(client, ns) == set(podnames), timeout=90)


def test_gang_left_below_its_minimum_is_evicted_whole_after_the_grace(
        stack: TestCluster, client: Client) -> None:
    ns, _ = project_namespace(client, "gang-stale")
    # Past the barrier one binding is refused (the API server refuses the Binding itself):
    # three members are bound, the fourth is not, and stays so.
    policy = "refuse-gang-binding"
    refuse(stack, policy, "pods/binding", f"!(request.namespace == '{ns}' && "
           "object.metadata.name == 's-3')")
    binding = stack.workdir / "binding.json"  # type: ignore[operator]
    binding.write_text(json.dumps({"apiVersion": "v1", "kind": "Binding",
                                   "metadata": {"name": "s-3"},
                                   "target": {"apiVersion": "v1", "kind": "Node",
                                              "name": "wl-0"}}))
    enforced(stack, policy, "create", "--raw",
             f"/api/v1/namespaces/{ns}/pods/s-3/binding?dryRun=All", "-f", str(binding))
    try:
        gang_pods(client, ns, "s", 4)
        wait_until("FailedBinding on s-3", lambda: failed_binding(client, ns, "s-3"),
                   timeout=60)
        # Below its minimum with members bound: after the grace they are evicted, each told why.
        def evicted() -> bool:
            stale = {n for n in ("s-0", "s-1", "s-2")
                     if any(e.reason == "StaleGang" for e in events_of(client, ns, n))}
            return len(stale) == 3

        wait_until("StaleGang on s-0..s-2", evicted, timeout=STALE_SECONDS + 60)
        message = next(e.message for e in events_of(client, ns, "s-0") if e.reason == "StaleGang")
        assert "3 of 4 members placed" in message and "stale-gang-seconds" in message
        wait_until("the bound members gone", lambda: not bound_names(client, ns), timeout=60)
        left = {p.metadata.name for p in client.list(Pod, namespace=ns)}
        assert left == {"s-3"}, left
    finally:
        allow(stack, policy)

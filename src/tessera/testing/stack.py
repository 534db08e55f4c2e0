"""tessera's whole stack on a test cluster, as the Helm chart would run it, for ``cluster up``.

- the chart's CRDs and RBAC (``helm template``), so each component runs as its own
  ServiceAccount with exactly the chart's rules;
- the admission webhook (``python -m tessera.kube.admission``) with a serving certificate from
  the cluster's CA, registered through the chart's own Mutating/ValidatingWebhookConfiguration;
- ``tessera-scheduler`` as ServiceAccount ``tessera-system/tessera-scheduler`` (the identity the
  webhook lets write tessera's annotations);
- the node side (one tessera-node per simulated GPU node and the kubelet pod-resources double)
  is started with the nodes (``TestCluster.create_gpu_nodes``);
- a Project ``default`` owning namespace ``default`` (deserved: every GPU), so a Run:ai or cGPU
  manifest applied there as it is gets admitted and bound.

Each component is its own process. ``Stack.supervise()`` restarts one that exited (as a
Deployment's ReplicaSet would), so ``kill -9`` of the scheduler or the webhook leaves the
cluster up and the component back within a second or two.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from tessera.kube import names
from tessera.testing import webhook as local
from tessera.testing.processes import ClusterHandle, ManagedProcess, free_ports

DEFAULT_NAMESPACE = "default"


@dataclass
class Stack:
    cluster: ClusterHandle
    components: list[ManagedProcess] = field(default_factory=list)
    webhook_url: str = ""
    restarts: dict[str, int] = field(default_factory=dict)

    def supervise(self, say: Callable[[str], None]) -> None:
        """Restart every component that has exited; say so."""
        for proc in self.components:
            if proc.alive():
                continue
            code = proc.popen.returncode if proc.popen else None
            self.restarts[proc.name] = self.restarts.get(proc.name, 0) + 1
            say(f"{proc.name} exited (code {code}); restarting it (log: {proc.log_path})")
            proc.start()

    def stop(self) -> None:
        for proc in reversed(self.components):
            proc.stop()
        self.components.clear()


def start_stack(cluster: ClusterHandle, *, gpus: int = 0, webhook_args: tuple[str, ...] = (),
                scheduler_args: tuple[str, ...] = ()) -> Stack:
    """Start webhook and scheduler against ``cluster`` (nodes may come before or after);
    ``gpus``: the default Project's deserved GPUs; ``webhook_args``, ``scheduler_args``: more
    flags (the real node's host paths, its reservation image)."""
    assert cluster.workdir is not None
    docs = local.helm_template(include_crds=True)
    local.apply(cluster, [d for d in docs if d["kind"] == "CustomResourceDefinition"])
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                    "crd/projects.tessera.io", "crd/podgroups.tessera.io")
    cluster.kubectl("create", "namespace", names.SYSTEM_NAMESPACE, check=False)
    local.apply(cluster, [d for d in docs if d["kind"] in (
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")])
    system = names.SYSTEM_NAMESPACE
    stack = Stack(cluster)
    hook_kc = cluster.service_account_kubeconfig(system, "tessera-webhook")
    (port,) = free_ports(1)
    hook = local.start_webhook(cluster, name="tessera-webhook", kubeconfig=hook_kc, port=port,
                              extra_args=list(webhook_args))
    stack.components.append(hook.process)
    stack.webhook_url = hook.url
    sched_kc = cluster.service_account_kubeconfig(system, "tessera-scheduler")
    scheduler = ManagedProcess(
        "tessera-scheduler",
        [sys.executable, "-m", "tessera.kube.scheduler", f"--kubeconfig={sched_kc}",
         *scheduler_args],
        cluster.workdir / "logs" / "tessera-scheduler.log")
    scheduler.start()
    stack.components.append(scheduler)
    local.register(cluster, hook)
    local.apply(cluster, [{
        "apiVersion": f"{names.GROUP}/{names.VERSION}", "kind": "Project",
        "metadata": {"name": DEFAULT_NAMESPACE},
        "spec": {"namespace": DEFAULT_NAMESPACE, "resources": {"gpu": {"deserved": max(gpus, 1)}}},
    }])
    return stack

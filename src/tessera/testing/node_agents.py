"""The node side of simulated GPU nodes: one tessera-node process per kwok node.

Each node gets its own fake NVML machine (``native/fakedriver`` on ``LD_LIBRARY_PATH``: that
node's model, GPU count and UUIDs, its own process-state file) and its own pod-resources socket,
served by the kubelet double (:mod:`tessera.testing.kubelet`, one process for all nodes) from
the device assignment it makes. The agent is the real ``python -m tessera.node run``.

    agents = start_node_agents(cluster, ["gpu-node-0", "gpu-node-1"])   # after create_gpu_nodes
    agents.wait_ready()                                                 # tessera.io/node-ready
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tessera.core.gpu_models import GPU_MODELS
from tessera.isolation.build import ensure_built
from tessera.testing.gpu_nodes import GPU_UUIDS_ANNOTATION
from tessera.testing.processes import ClusterError, ClusterHandle, ManagedProcess, free_ports

READY = "tessera.io/node-ready"


@dataclass
class NodeAgent:
    node: str
    process: ManagedProcess
    root: Path
    metrics_port: int
    uuids: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def kill9(self) -> None:
        """SIGKILL, as a crash or an OOM kill would."""
        assert self.process.popen is not None
        self.process.popen.kill()
        self.process.popen.wait(10)

    def restart(self) -> None:
        self.process.start(env=self.env)

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def containers_dir(self) -> Path:
        return self.root / "containers"

    @property
    def library_dir(self) -> Path:
        return self.root / "isolation"

    @property
    def registration_socket(self) -> Path:
        """The kubelet DRA plugin's registration socket (the node's plugins_registry)."""
        return self.root / "plugins_registry" / "gpu.tessera.io-reg.sock"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def gpu_state(self) -> Path:
        return self.root / "gpu.state"


@dataclass
class NodeAgents:
    cluster: ClusterHandle
    kubelet: ManagedProcess
    agents: dict[str, NodeAgent] = field(default_factory=dict)

    def wait_ready(self, timeout: float = 60.0) -> None:
        from lightkube.resources.core_v1 import Node

        client = self.cluster.client()
        deadline = time.monotonic() + timeout
        pending = set(self.agents)
        while pending:
            for name in list(pending):
                node = client.get(Node, name)
                if ((node.metadata.annotations or {}) if node.metadata else {}).get(READY) == "true":
                    pending.discard(name)
            if not pending:
                return
            for a in self.agents.values():
                a.process.check_alive()
            self.kubelet.check_alive()
            if time.monotonic() > deadline:
                raise ClusterError(f"tessera-node not ready on {sorted(pending)} within {timeout}s")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stops the agents and the kubelet double (and forgets them in the cluster)."""
        for proc in [*(a.process for a in self.agents.values()), self.kubelet]:
            proc.stop()
            if proc in self.cluster.processes:
                self.cluster.processes.remove(proc)
        if self in self.cluster.node_agents:
            self.cluster.node_agents.remove(self)


def nvml_name(model: str) -> str:
    """The name NVML reports for a model (GFD's product label with spaces)."""
    return GPU_MODELS[model].product.replace("-", " ")


def fake_machine_env(fake_dir: Path, model: str, uuids: list[str], state: Path) -> dict[str, str]:
    m = GPU_MODELS[model]
    return {
        "LD_LIBRARY_PATH": str(fake_dir),
        "FAKE_GPU_DEVICES": ";".join([f"{nvml_name(model)}={m.memory_mib}Mi"] * len(uuids)),
        "FAKE_GPU_UUIDS": ",".join(uuids),
        "FAKE_GPU_STATE": str(state),
        "FAKE_NVML_DRIVER_VERSION": "570.133.20",
    }


def agent_env(fake_dir: Path, model: str, uuids: list[str], state: Path,
              overrides: dict[str, str] | None = None) -> dict[str, str]:
    """tessera-node's environment on a simulated machine: this process's without the fake
    driver's, tessera's, CUDA's or a preload, then the fake machine's and ``overrides``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FAKE_", "TESSERA_", "CUDA_")) and k != "LD_PRELOAD"}
    env.update(fake_machine_env(fake_dir, model, uuids, state))
    env.update(overrides or {})
    return env


def agent_argv(name: str, kubeconfig: Path, root: Path, port: int, *, pod_resources: Path,
               containers_host_dir: Path | str, registration_dir: Path, plugin_dir: Path,
               cdi_dir: Path, extra: Sequence[str] = ()) -> list[str]:
    """tessera-node's command line: its own files under ``root``, metrics on the loopback at
    ``port``, the kubelet's socket and directories as given, then ``extra``."""
    return [sys.executable, "-m", "tessera.node", "run", f"--node-name={name}",
            f"--kubeconfig={kubeconfig}", f"--pod-resources-socket={pod_resources}",
            f"--library-dir={root / 'isolation'}", f"--containers-dir={root / 'containers'}",
            f"--containers-host-dir={containers_host_dir}", f"--loans-dir={root / 'loans'}",
            "--metrics-address=127.0.0.1", f"--metrics-port={port}",
            f"--dra-registration-dir={registration_dir}", f"--dra-plugin-dir={plugin_dir}",
            f"--cdi-dir={cdi_dir}", *extra]


def start_node_agents(cluster: ClusterHandle, nodes: list[str], *, kubeconfig: Path | None = None,
                      on_escape: str = "warn", sync_interval: float = 0.5,
                      extra_args: list[str] | None = None,
                      env_overrides: dict[str, str] | None = None,
                      chart_values: tuple[str, ...] | None = None) -> NodeAgents:
    """Starts the kubelet double for ``nodes`` and one tessera-node per node (see module doc).
    ``kubeconfig``: the agents' credentials (default admin; tests pass the chart's
    ServiceAccount so its RBAC is what is tested). Each agent runs under exactly the
    capabilities, user and no_new_privs the Helm chart gives it (tessera.testing.chart_privileges,
    rendered with ``--set`` ``chart_values``; default ``nodeAgent.manageMig=true`` when a GPU is
    in MIG mode, as a cluster using dynamic MIG is installed)."""
    from lightkube.resources.core_v1 import Node

    from tessera.testing import chart_privileges

    assert cluster.workdir is not None
    native = ensure_built()
    root = cluster.workdir / "nodes"
    root.mkdir(exist_ok=True)
    client = cluster.client()
    devices: dict[str, list[str]] = {}
    models: dict[str, str] = {}
    for name in nodes:
        node = client.get(Node, name)
        meta = node.metadata
        assert meta is not None
        uuids = [u for u in (meta.annotations or {}).get(GPU_UUIDS_ANNOTATION, "").split(",") if u]
        product = (meta.labels or {}).get("nvidia.com/gpu.product", "")
        model = next((k for k, m in GPU_MODELS.items() if m.product == product), None)
        if model is None or not uuids:
            raise ClusterError(f"node {name}: not a simulated GPU node (product {product!r})")
        devices[name], models[name] = uuids, model
    devices_file = root / f"devices-{len(list(root.glob('devices-*.json')))}.json"
    devices_file.write_text(json.dumps(devices))
    logs = cluster.workdir / "logs"
    kubelet = ManagedProcess(
        f"kubelet-double-{devices_file.stem}",
        [sys.executable, "-m", "tessera.testing.kubelet", f"--kubeconfig={cluster.kubeconfig}",
         f"--dir={root}", f"--devices={devices_file}"],
        logs / f"kubelet-double-{devices_file.stem}.log")
    kubelet.start()
    cluster.processes.append(kubelet)
    sock_deadline = time.monotonic() + 30
    while not all((root / n / "kubelet.sock").exists() for n in nodes):
        kubelet.check_alive()
        if time.monotonic() > sock_deadline:
            raise ClusterError("kubelet double did not create its sockets within 30 s")
        time.sleep(0.05)
    result = NodeAgents(cluster, kubelet)
    if chart_values is None:
        mig = any(k.startswith("FAKE_GPU_MIG_") and v != "0"
                  for k, v in (env_overrides or {}).items())
        chart_values = ("nodeAgent.manageMig=true",) if mig else ()
    privileges = (chart_privileges.chart_privileges(*chart_values)
                  if chart_privileges.enforced() else None)
    ports = free_ports(len(nodes))
    for name, port in zip(nodes, ports, strict=True):
        node_root = root / name
        node_root.mkdir(exist_ok=True)
        env = agent_env(native.fake_dir, models[name], devices[name], node_root / "gpu.state",
                        env_overrides)
        argv = agent_argv(
            name, kubeconfig or cluster.kubeconfig, node_root, port,
            pod_resources=node_root / "kubelet.sock",
            # what the webhook's hostPath volumes name (its default)
            containers_host_dir="/var/lib/tessera/containers",
            # the kubelet's directories, per node (the DRA plugin's sockets, CDI specs)
            registration_dir=node_root / "plugins_registry",
            plugin_dir=node_root / "plugins" / "gpu.tessera.io", cdi_dir=node_root / "cdi",
            extra=[f"--on-escape={on_escape}", f"--sync-interval={sync_interval}",
                   *(extra_args or [])])
        proc = ManagedProcess(f"tessera-node-{name}",
                              privileges.wrap(argv) if privileges else argv,
                              logs / f"tessera-node-{name}.log")
        proc.start(env=env)
        cluster.processes.append(proc)
        result.agents[name] = NodeAgent(name, proc, node_root, port, devices[name], env)
    return result

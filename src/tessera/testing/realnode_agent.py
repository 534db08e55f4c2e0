"""tessera-node on the real node (tessera.testing.realnode): the kubelet's DRA driver and device
agent, as the chart runs it.

It runs on the host (the node's sockets and directories are plain paths here) under exactly the
capabilities, user and ``no_new_privs`` of the chart's rendered DaemonSet
(tessera.testing.chart_privileges), on a fake NVML machine (the only double: the GPU and its
driver). The pods get the same fake driver the way the NVIDIA container toolkit gives them the
real one: :func:`driver_volumes` mounts its directory and :func:`driver_env` names it. The fake
driver also gets the host's ``/proc`` (read-only, ``FAKE_HOST_PROC``): the real driver knows a
container's processes by their host pids in the kernel, the fake learns them there, so NVML on
the node lists them as a real one does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.isolation.build import ensure_built
from tessera.testing import chart_privileges
from tessera.testing.cluster import ManagedProcess, free_ports
from tessera.testing.gpu_nodes import gpu_uuids
from tessera.testing.node_agents import agent_argv, agent_env
from tessera.testing.realnode import RealNode

DRIVER_MOUNT = "/usr/local/nvidia/lib64"
STATE_MOUNT = "/var/run/fake-gpu"
HOST_PROC_MOUNT = "/host/proc"


@dataclass
class RealNodeAgent:
    node: RealNode
    process: ManagedProcess
    root: Path
    uuids: list[str]
    env: dict[str, str]
    port: int

    @property
    def state_dir(self) -> Path:
        return self.root / "fake-gpu"

    @property
    def containers_dir(self) -> Path:
        return self.root / "containers"

    @property
    def registration_socket(self) -> Path:
        return self.node.registration_dir / "gpu.tessera.io-reg.sock"

    def restart(self) -> None:
        self.process.stop()
        self.process.start(env=self.env)

    def stop(self) -> None:
        self.process.stop()
        if self.process in self.node.cluster.processes:
            self.node.cluster.processes.remove(self.process)


def start_agent(node: RealNode, *, model: str = "A100-40GB", gpus: int = 2,
                env_overrides: dict[str, str] | None = None,
                chart_values: tuple[str, ...] = (),
                extra_args: tuple[str, ...] = (),
                kubeconfig: Path | None = None) -> RealNodeAgent:
    native = ensure_built()
    root = node.scratch / "agent"
    state_dir = root / "fake-gpu"
    for d in (root, state_dir):
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)
    state_dir.chmod(0o777)  # the pods' fake driver (any user) shares the machine's state
    state = state_dir / "gpu.state"
    if not state.exists():
        state.touch()
    state.chmod(0o666)
    uuids = gpu_uuids(node.name, gpus)
    env = agent_env(native.fake_dir, model, uuids, state, env_overrides)
    (port,) = free_ports(1)
    argv = agent_argv(
        node.name, kubeconfig or node.cluster.kubeconfig, root, port, pod_resources=node.pod_resources_socket,
        # the runtime mounts the claims' files from here (the chart's hostPath is the same path
        # on both sides)
        containers_host_dir=root / "containers", registration_dir=node.registration_dir,
        plugin_dir=node.plugin_dir, cdi_dir=node.cdi_dir,
        extra=["--sync-interval=0.5", *extra_args])
    privileges = chart_privileges.chart_privileges(*chart_values)
    proc = ManagedProcess(f"tessera-node-{node.name}", privileges.wrap(argv),
                          node.logs / f"tessera-node-{node.name}.log")
    proc.start(env=env)
    node.cluster.processes.append(proc)
    return RealNodeAgent(node, proc, root, uuids, env, port)


def driver_env(agent: RealNodeAgent) -> list[dict[str, str]]:
    """The pod's view of the node's (fake) driver: its library path and machine."""
    env = {k: v for k, v in agent.env.items() if k.startswith("FAKE_")}
    env["FAKE_GPU_STATE"] = f"{STATE_MOUNT}/gpu.state"
    env["LD_LIBRARY_PATH"] = DRIVER_MOUNT
    env["FAKE_HOST_PROC"] = HOST_PROC_MOUNT  # the fake knows host pids, as the kernel driver does
    return [{"name": k, "value": v} for k, v in sorted(env.items())]


def driver_volumes(agent: RealNodeAgent) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts) that give a pod the node's driver, as the toolkit would."""
    native = ensure_built()
    volumes: list[dict[str, Any]] = [{"name": "nvidia-driver", "hostPath": {"path": str(native.fake_dir),
                                                      "type": "Directory"}},
               {"name": "fake-gpu-state", "hostPath": {"path": str(agent.state_dir),
                                                       "type": "Directory"}},
               {"name": "host-proc", "hostPath": {"path": "/proc", "type": "Directory"}}]
    mounts: list[dict[str, Any]] = [{"name": "nvidia-driver", "mountPath": DRIVER_MOUNT, "readOnly": True},
              {"name": "fake-gpu-state", "mountPath": STATE_MOUNT},
              {"name": "host-proc", "mountPath": HOST_PROC_MOUNT, "readOnly": True}]
    return volumes, mounts

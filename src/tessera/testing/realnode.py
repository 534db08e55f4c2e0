"""A real node in the test cluster: kubelet v1.36.3 + containerd 2.x + runc (issue 27, item 2).

kwok plays nodes that run nothing. This harness runs a real kubelet (built from the Go module
proxy at the cluster's version, tessera.testing.node_binaries), containerd 2.x (CDI on) and
Debian's runc on this machine, registered with the test cluster's API server as node
``tessera-real-0`` next to the kwok nodes. Pods bound to it are started by the real runtime.

Everything runs in its own network and mount namespace (``unshare --net --mount``), so the
host's network, sysctls and iptables stay as they were: inside, the loopback carries the node IP
``10.200.0.1`` (the kubelet refuses a loopback node IP); the kernel tunables the kubelet wants
are files bind-mounted over ``/proc/sys/...`` (it reads them and writes nothing to the host); a
tmpfs over ``/var/log`` gives it its fixed ``/var/log/containers``. The kubelet reaches the API
server on the host's loopback through two relays joined by a unix socket
(tessera.testing.nsrelay). The API server cannot reach the kubelet (no logs/exec through it);
the tests read container logs from the kubelet's ``podLogsDir``. The sandbox's own limits and
the config that works around each are in docs/real-node.md.

Unix sockets and files are shared with the host, so tessera-node runs on the host as the
node's DRA driver and device agent: the kubelet's plugin registry, pod-resources socket and
containerd's CDI directory are plain paths (:attr:`RealNode.root` and friends).

Needs root, ``unshare``, ``ip``, Debian's ``runc`` and ``containernetworking-plugins`` (the
setup hook ``scripts/setup.d/45-real-node.sh`` installs them), gcc for the pause image.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from tessera.testing import binaries, node_binaries, node_images
from tessera.testing.cluster import ClusterError, ManagedProcess, TestCluster

NODE_NAME = "tessera-real-0"
NODE_IP = "10.200.0.1"
POD_SUBNET = "10.244.0.0/24"
CNI_DIR = Path("/usr/lib/cni")
NODE_BINARIES = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr")
FAKE_SYSCTLS = {"vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10",
                "kernel/panic_on_oops": "1", "kernel/keys/root_maxkeys": "1000000",
                "kernel/keys/root_maxbytes": "25000000"}


class RealNodeUnavailable(RuntimeError):
    """The machine lacks what the real node needs; the message says what and how to get it."""


def missing_prerequisites() -> list[str]:
    missing = []
    if os.geteuid() != 0:
        missing.append("root (the node's namespaces, mounts and cgroups)")
    for tool, package in [("runc", "runc"), ("unshare", "util-linux"), ("ip", "iproute2"),
                          ("gcc", "gcc")]:
        if shutil.which(tool) is None:
            missing.append(f"{tool} (apt-get install -y {package})")
    if not (CNI_DIR / "bridge").exists():
        missing.append(f"{CNI_DIR}/bridge (apt-get install -y containernetworking-plugins)")
    return missing


def ensure_binaries() -> dict[str, Path]:
    assert node_binaries.NODE_BINARIES  # registers the node binaries in binaries.BINARIES
    return binaries.ensure(list(NODE_BINARIES))


class RealNode:
    def __init__(self, cluster: TestCluster, name: str = NODE_NAME, ip: str = NODE_IP) -> None:
        assert cluster.workdir is not None
        self.cluster, self.name, self.ip = cluster, name, ip
        self.scratch = cluster.workdir / "realnode"
        self.root = self.scratch / "root"
        self.cdi_dir = self.scratch / "cdi"
        self.pod_logs = self.scratch / "pod-logs"
        self.logs = cluster.workdir / "logs"
        self.world: ManagedProcess | None = None
        self.relay: ManagedProcess | None = None
        self.startup_seconds = 0.0

    # -- paths tessera-node needs
    @property
    def registration_dir(self) -> Path:
        return self.root / "plugins_registry"

    @property
    def plugin_dir(self) -> Path:
        return self.root / "plugins" / "gpu.tessera.io"

    @property
    def pod_resources_socket(self) -> Path:
        return self.root / "pod-resources" / "kubelet.sock"

    @property
    def device_plugins_dir(self) -> Path:
        """The kubelet's device-plugin directory (its ``kubelet.sock``): the kubelet always uses
        ``/var/lib/kubelet/device-plugins`` whatever its root dir, so the node's mount namespace
        has this directory bind-mounted there."""
        return self.scratch / "device-plugins"

    @property
    def containerd_socket(self) -> Path:
        return self.scratch / "run" / "containerd.sock"

    @property
    def kubelet_log(self) -> Path:
        return self.logs / "real-node.log"

    def start(self, timeout: float = 180.0) -> None:
        missing = missing_prerequisites()
        if missing:
            raise RealNodeUnavailable("the real node needs " + "; ".join(missing))
        busy = [p for p in Path("/sys/fs/cgroup/pids/kubepods").rglob("cgroup.procs")
                if p.read_text().strip()]
        if busy:  # the kubelet's cgroups are machine-wide: one real node at a time
            raise RealNodeUnavailable(f"another kubelet's pods run on this machine ({busy[0]}); "
                                      "the real-node tier runs one node per machine at a time")
        t0 = time.monotonic()
        paths = ensure_binaries()
        bindir = self.scratch / "bin"
        for d in [bindir, self.cdi_dir, self.pod_logs, self.root, self.scratch / "run",
                  self.device_plugins_dir,
                  self.scratch / "sysctl", self.scratch / "cni" / "net.d", self.scratch / "images"]:
            d.mkdir(parents=True, exist_ok=True)
        for name, path in paths.items():
            link = bindir / name
            link.unlink(missing_ok=True)
            link.symlink_to(path)
        native = _native_tests()
        images = self.scratch / "images"
        pause = node_images.pause_image(
            images, node_images.kubernetes_pause_source(binaries.KUBERNETES_VERSION))
        probe = node_images.probe_image(images, native / "cuprobe")
        self._write_configs(bindir)
        api_port = int(self.cluster.server.rsplit(":", 1)[1])
        api_sock = self.scratch / "run" / "api.sock"
        self.relay = ManagedProcess("real-node-api-relay", [
            sys.executable, "-m", "tessera.testing.nsrelay", f"unix:{api_sock}",
            f"tcp:127.0.0.1:{api_port}"], self.logs / "real-node-api-relay.log")
        self.relay.start()
        self.cluster.processes.append(self.relay)
        world = self.scratch / "world.sh"
        world.write_text(self._world_script(bindir, api_port, api_sock, [pause, probe]))
        self.world = ManagedProcess("real-node", [
            "unshare", "--net", "--mount", "--propagation", "private", "--fork",
            "bash", str(world)], self.kubelet_log)
        self.world.start()
        self.cluster.processes.append(self.world)
        self._wait_ready(timeout)
        self.startup_seconds = time.monotonic() - t0

    def _wait_ready(self, timeout: float) -> None:
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Node

        client = self.cluster.client()
        deadline = time.monotonic() + timeout
        while True:
            assert self.world is not None
            self.world.check_alive()
            with contextlib.suppress(ApiError):
                node = client.get(Node, self.name)
                conds = {c.type: c.status for c in (node.status.conditions or [])}
                if conds.get("Ready") == "True":
                    return
            if time.monotonic() > deadline:
                raise ClusterError(f"real node {self.name} not Ready within {timeout:.0f} s; "
                                   f"last lines of {self.kubelet_log}:\n"
                                   f"{self.world.log_tail(40)}")
            time.sleep(0.5)

    def _write_configs(self, bindir: Path) -> None:
        runc = shutil.which("runc")
        s = self.scratch
        (s / "containerd.toml").write_text(f"""version = 4
root = "{s}/containerd/root"
state = "{s}/containerd/state"
[plugins.'io.containerd.server.v1.grpc']
  address = "{self.containerd_socket}"
[plugins.'io.containerd.server.v1.ttrpc']
  address = "{self.containerd_socket}.ttrpc"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{node_images.PAUSE_IMAGE}'
[plugins.'io.containerd.cri.v1.runtime']
  disable_apparmor = true
  restrict_oom_score_adj = true
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = ["{self.cdi_dir}"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = '{runc}'
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['{CNI_DIR}']
    conf_dir = "{s}/cni/net.d"
""")
        (s / "cni" / "net.d" / "10-tessera-bridge.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "tessera-real", "plugins": [
                {"type": "bridge", "bridge": "tsr0", "isGateway": False, "ipMasq": False,
                 "ipam": {"type": "host-local", "subnet": POD_SUBNET,
                          "dataDir": str(s / "cni" / "ipam")}},
                {"type": "loopback"}]}))
        sock = f"unix://{self.containerd_socket}"
        (s / "kubelet-config.yaml").write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupsPerQOS": True,
            "enforceNodeAllocatable": ["pods"], "failSwapOn": False,
            "containerRuntimeEndpoint": sock, "imageServiceEndpoint": sock,
            "podLogsDir": str(self.pod_logs), "address": self.ip, "port": 10250,
            "readOnlyPort": 0, "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"}, "maxOpenFiles": 20000,
            "makeIPTablesUtilChains": False, "resolvConf": "/etc/resolv.conf",
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "syncFrequency": "5s", "fileCheckFrequency": "5s",
        }, indent=1))
        for key, value in FAKE_SYSCTLS.items():
            (s / "sysctl" / key.replace("/", ".")).write_text(value + "\n")

    def _world_script(self, bindir: Path, api_port: int, api_sock: Path,
                      images: list[Path]) -> str:
        s = self.scratch
        sysctls = "\n".join(
            f"[ -e /proc/sys/{k} ] && mount --bind {s}/sysctl/{k.replace('/', '.')} /proc/sys/{k}"
            for k in FAKE_SYSCTLS)
        imports = "\n".join(
            f"ctr --address {self.containerd_socket} -n k8s.io images import "
            f"--base-name {_base(img)} {img}" for img in images)
        return f"""set -euo pipefail
echo "[real-node] namespace pid $$"
ip link set lo up
ip addr add {self.ip}/32 dev lo
mount -t tmpfs -o size=16m tmpfs /var/log
mkdir -p /var/log/containers
mkdir -p /var/lib/kubelet/device-plugins
mount --bind {self.device_plugins_dir} /var/lib/kubelet/device-plugins
{sysctls}
export PATH={bindir}:$PATH
{sys.executable} -m tessera.testing.nsrelay tcp:127.0.0.1:{api_port} unix:{api_sock} &
containerd --config {s}/containerd.toml > {self.logs}/real-node-containerd.log 2>&1 &
for i in $(seq 300); do [ -S {self.containerd_socket} ] && break; sleep 0.1; done
{imports}
echo "[real-node] images imported; starting the kubelet"
exec kubelet --config={s}/kubelet-config.yaml --kubeconfig={self.cluster.kubeconfig} \\
  --root-dir={self.root} --hostname-override={self.name} --node-ip={self.ip} \\
  --node-labels=tessera.io/real-node=true --v=2
"""

    def pod_log(self, namespace: str, pod: str, container: str) -> str:
        """The container's log as the kubelet wrote it (CRI format: time stream tag text)."""
        lines = []
        for path in sorted(self.pod_logs.glob(f"{namespace}_{pod}_*/{container}/*.log")):
            for line in path.read_text(errors="replace").splitlines():
                parts = line.split(" ", 3)
                lines.append(parts[3] if len(parts) == 4 else line)
        return "\n".join(lines)

    def kubelet_log_text(self) -> str:
        return self.kubelet_log.read_text(errors="replace")

    def stop(self, timeout: float = 60.0) -> None:
        """Pods on the node deleted while the kubelet runs, then the kubelet and containerd
        stopped, leftover shims and container processes ended by PID, cgroups removed."""
        if self.world is not None and self.world.alive():
            with contextlib.suppress(Exception):
                self._drain(timeout)
        for proc in [self.world, self.relay]:
            if proc is not None:
                proc.stop()
                if proc in self.cluster.processes:
                    self.cluster.processes.remove(proc)
        for pid in self._leftover_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        _remove_cgroups()

    def _drain(self, timeout: float) -> None:
        from lightkube.resources.core_v1 import Pod

        client = self.cluster.client()
        selector = {"spec.nodeName": self.name}
        for pod in client.list(Pod, namespace="*", fields=selector):
            with contextlib.suppress(Exception):
                client.delete(Pod, pod.metadata.name, namespace=pod.metadata.namespace,
                              grace_period=0)
        deadline = time.monotonic() + timeout
        while list(client.list(Pod, namespace="*", fields=selector)):
            if time.monotonic() > deadline:
                return
            time.sleep(0.5)

    def _leftover_pids(self) -> list[int]:
        """Shims of this node's containerd (named by its socket) and processes in the kubelet's
        pod cgroups."""
        pids: set[int] = set()
        marker = str(self.containerd_socket).encode()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if marker in (entry / "cmdline").read_bytes():
                        pids.add(int(entry.name))
        for procs in Path("/sys/fs/cgroup/pids/kubepods").rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in procs.read_text().split())
        pids.discard(os.getpid())
        return sorted(pids)


def _base(image: Path) -> str:
    return {"pause.oci.tar": node_images.PAUSE_IMAGE,
            "probe.oci.tar": node_images.PROBE_IMAGE}[image.name].rsplit(":", 1)[0]


def _remove_cgroups() -> None:
    for controller in Path("/sys/fs/cgroup").iterdir():
        top = controller / "kubepods"
        if not top.is_dir():
            continue
        for d in sorted((p for p in top.rglob("*") if p.is_dir()),
                        key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def _native_tests() -> Path:
    from tessera.isolation.build import ensure_built

    return Path(ensure_built().root) / "tests"


def node_status(cluster: TestCluster, name: str = NODE_NAME) -> Any:
    from lightkube.resources.core_v1 import Node

    return cluster.client().get(Node, name)

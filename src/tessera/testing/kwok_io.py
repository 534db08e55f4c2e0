"""GPU nodes whose "kubelet" answers ``pods/log`` and ``pods/exec``, for tests of logs and exec.

The test cluster's kwok runs no kubelet server, so the API server cannot reach a kubelet for its
pods. This starts a second kwok that manages only its own nodes (annotation
``tessera.io/kwok-io=true``) and serves the kubelet API over TLS on a free port (the nodes'
``daemonEndpoints``), configured with kwok's ``ClusterExec`` (exec runs the command on this
machine, as a local process, with ``KWOK_EXEC=yes`` in its environment) and ``ClusterLogs``
(every container's log is ``logs_file``, in the CRI log format). The API server, its
authorization and its WebSocket proxy are the real ones.
"""

from __future__ import annotations

import os
from pathlib import Path

from tessera.testing import binaries
from tessera.testing.cluster import TestCluster
from tessera.testing.gpu_nodes import KWOK_ANNOTATION, NodeShape, node_manifest
from tessera.testing.processes import ManagedProcess, free_ports

IO_ANNOTATION = "tessera.io/kwok-io"


def cri_log(lines: list[tuple[str, str]]) -> str:
    """(stream, text) pairs as a CRI container log (what kubelets read)."""
    return "".join(f"2026-01-01T00:00:{i:02d}.000000000Z {stream} F {text}\n"
                   for i, (stream, text) in enumerate(lines))


def start_io_nodes(cluster: TestCluster, names: list[str], shape: NodeShape,
                   logs_file: Path) -> ManagedProcess:
    """Start the second kwok and create ``names`` as its nodes; returns the process (stop it and
    remove it from ``cluster.processes`` when done)."""
    from lightkube import codecs
    from lightkube.resources.core_v1 import Node

    assert cluster.workdir is not None
    wd = cluster.workdir
    (port,) = free_ports(1)
    cert, key, _ = cluster.issue_serving_cert("kwok-io-kubelet", ["127.0.0.1", "localhost"])
    config = wd / "kwok-io.yaml"
    config.write_text(f"""kind: ClusterExec
apiVersion: kwok.x-k8s.io/v1alpha1
metadata: {{name: tessera-exec-local}}
spec:
  execs:
  - local:
      envs: [{{name: KWOK_EXEC, value: "yes"}}]
---
kind: ClusterLogs
apiVersion: kwok.x-k8s.io/v1alpha1
metadata: {{name: tessera-logs-local}}
spec:
  logs:
  - logsFile: {logs_file}
""")
    proc = ManagedProcess("kwok-io", [
        str(cluster.paths["kwok"]), f"--kubeconfig={cluster.kubeconfig}",
        f"--config={binaries.kwok_stages_file()}", f"--config={config}",
        f"--manage-nodes-with-annotation-selector={IO_ANNOTATION}=true",
        "--cidr=10.200.0.0/16", "--node-ip=127.0.0.1", f"--node-port={port}",
        f"--server-address=127.0.0.1:{port}", f"--tls-cert-file={cert}",
        f"--tls-private-key-file={key}",
    ], wd / "logs" / "kwok-io.log")
    proc.start(env={**os.environ, "HOME": str(wd)})
    cluster.processes.append(proc)
    client = cluster.client()
    for i, name in enumerate(names):
        manifest = node_manifest(name, shape, index=i)
        annotations = manifest["metadata"]["annotations"]
        del annotations[KWOK_ANNOTATION]
        annotations[IO_ANNOTATION] = "true"
        node = client.create(codecs.from_dict(manifest))
        if not (node.status and node.status.allocatable):
            client.patch(Node, name, {"status": manifest["status"]}, subresource="status")
    cluster.wait_nodes_ready(names)
    if shape.gpus > 0:  # the node side, as create_gpu_nodes starts it
        from tessera.testing.node_agents import start_node_agents

        agents = start_node_agents(cluster, names)
        cluster.node_agents.append(agents)
        agents.wait_ready()
    return proc

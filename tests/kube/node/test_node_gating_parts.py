"""The scheduler's side of tessera-node readiness, without a cluster: parsing and the snapshot."""

from __future__ import annotations

from lightkube import codecs

from tessera.core.cycle import CycleConfig, run_cycle
from tessera.core.model import GpuDevice, Node
from tessera.core.projects import Project, Quota
from tessera.kube import names
from tessera.kube.objects import NodeInfo, PodInfo, ProjectInfo, node_info
from tessera.kube.podspec import ContainerResources, pod_request
from tessera.kube.snapshot import SnapshotBuilder, agents_not_ready_text
from tessera.testing.gpu_nodes import NodeShape, node_manifest


def _node_obj(name: str, gpus: int, annotations: dict[str, str]) -> object:
    m = node_manifest(name, NodeShape(gpus=gpus, model="H100-80GB"))
    m["metadata"]["annotations"].update(annotations)
    m["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return codecs.from_dict(m)


def test_node_info_reads_the_agent_readiness() -> None:
    silent = node_info(_node_obj("a", 2, {}))
    assert (silent.agent_ready, silent.agent_reason) == (
        False, "no tessera-node has reported on this node")
    broken = node_info(_node_obj("b", 2, {names.NODE_READY: "false",
                                          names.NODE_READY_REASON: "NVML could not be initialised"}))
    assert (broken.agent_ready, broken.agent_reason) == (False, "NVML could not be initialised")
    ok = node_info(_node_obj("c", 2, {names.NODE_READY: "true"}))
    assert (ok.agent_ready, ok.agent_reason) == (True, "")
    cpu_only = node_info(_node_obj("d", 0, {}))
    assert cpu_only.agent_ready, "a node without GPUs needs no agent"


def test_nothing_new_on_a_node_whose_agent_is_not_ready() -> None:
    def node(name: str) -> Node:
        return Node(name, tuple(GpuDevice(f"{name}-g{i}", i, 80 * 2**30, "H100-80GB")
                                for i in range(2)), 96000, 2**40)

    projects = {"team-a": ProjectInfo("team-a", Project("team-a", Quota(2)), "team-a")}
    pods = {}
    for i in range(3):
        ann = {names.GPU_PORTION: "0.5"}
        p = PodInfo("team-a", f"p{i}", f"u{i}", None, "Pending", False, 1.0, None, ann, {}, None)
        p.request = pod_request(ann, [ContainerResources("main", {}, {})])
        pods[p.key] = p
    nodes = {"a": NodeInfo("a", node("a"), agent_ready=False, agent_reason="NVML missing"),
             "b": NodeInfo("b", node("b"))}
    snap, ctx = SnapshotBuilder().build(nodes, pods, projects, {}, {}, set(), 5.0)
    assert ctx.agents_not_ready == {"a": "NVML missing"}
    plan = run_cycle(snap, CycleConfig(actions=("allocate",)))
    assert {pb.placement.node for b in plan.bindings for pb in b.pods} == {"b"}
    assert agents_not_ready_text(ctx.agents_not_ready) == (
        "1 GPU node(s) not ready for GPU shares: a (tessera-node: NVML missing)")
    nodes["a"] = NodeInfo("a", node("a"))
    _, ctx = SnapshotBuilder().build(nodes, pods, projects, {}, {}, set(), 5.0)
    assert ctx.agents_not_ready == {}


def test_node_info_reads_nvlink_islands_from_the_agent_inventory() -> None:
    """The inventory tessera-node publishes (tessera.node.publish.inventory_json) gives the
    scheduler its NVLink islands; an absent or malformed one gives no preference (None), never
    an error that would keep the node out of placement."""
    import json

    def inventory(links: object, gpus: int = 4) -> dict[str, str]:
        return {names.NODE_GPU_INVENTORY: json.dumps({"gpus": [{"index": i} for i in range(gpus)],
                                                      "links": links})}

    pairs = [{"a": a, "b": b, "ancestor": "single", "nvlink": a // 2 == b // 2}
             for a in range(4) for b in range(a + 1, 4)]
    node = node_info(_node_obj("nv", 4, inventory(pairs))).node
    assert node is not None and node.nvlink == (0, 0, 1, 1)
    for bad in ({names.NODE_GPU_INVENTORY: "{not json"}, inventory("links"),
                inventory([{"a": "0", "b": 1, "nvlink": True}]), inventory(pairs, gpus=8), {}):
        info = node_info(_node_obj("x", 4, bad))
        assert info.node is not None and info.node.nvlink in (None, (0, 1, 2, 3)), bad
    none = node_info(_node_obj("y", 4, inventory(pairs[:0]))).node
    assert none is not None and none.nvlink == (0, 1, 2, 3)  # known: PCIe only

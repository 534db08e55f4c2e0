"""The Kubernetes predicates (tessera.kube.predicates), table-driven from the semantics the
Kubernetes documentation states (Assigning Pods to Nodes; Taints and Tolerations; Pod Topology
Spread Constraints; kube-scheduler plugins)."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.core.errors import InvalidRequest
from tessera.core.model import Node
from tessera.kube.predicates.cluster import ClusterView, NodeFacts, OtherPod, node_facts
from tessera.kube.predicates.constraint import constraint_for
from tessera.kube.predicates.spec import Taint, scheduling_spec, taints_of


def node(name: str, labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
         *, unschedulable: bool = False, ready: bool = True,
         resources: dict[str, int] | None = None, gpu_closed: str = "") -> NodeFacts:
    labels = {"kubernetes.io/hostname": name, **(labels or {})}
    return node_facts(name, labels, taints_of(taints), unschedulable=unschedulable, ready=ready,
                      resources=resources or {}, gpu_closed=gpu_closed)


class Placed:
    def __init__(self, where: dict[tuple[str, int], str]) -> None:
        self.where = where

    def node_of(self, workload_id: str, pod: int) -> str | None:
        return self.where.get((workload_id, pod))


def feasible(spec: dict[str, Any], nodes: list[NodeFacts], pods: list[OtherPod] = (),  # type: ignore[assignment]
             *, labels: dict[str, str] | None = None, namespace: str = "default",
             namespaces: dict[str, dict[str, str]] | None = None, gpu: bool = False,
             placed: dict[tuple[str, int], str] | None = None) -> list[str]:
    view = ClusterView()
    view.reset({n.name: n for n in nodes}, namespaces or {}, list(pods))
    sp = scheduling_spec(namespace, labels or {}, spec)
    sym = bool(view.symmetric_anti(namespace, tuple(sorted((labels or {}).items()))))
    if sp is None and sym:
        from tessera.kube.predicates.spec import SchedulingSpec
        sp = SchedulingSpec(namespace, tuple(sorted((labels or {}).items())))
    c = constraint_for(sp, gpu, view, sym)
    out = []
    for n in nodes:
        core = Node(n.name, labels=n.labels)
        if c.allows(core) and (not c.dynamic or c.admits(core, Placed(placed or {}))):
            out.append(n.name)
    return out


def reasons(spec: dict[str, Any], nodes: list[NodeFacts], pods: list[OtherPod] = (),  # type: ignore[assignment]
            labels: dict[str, str] | None = None) -> str:
    view = ClusterView()
    view.reset({n.name: n for n in nodes}, {}, list(pods))
    c = constraint_for(scheduling_spec("default", labels or {}, spec), False, view)
    return c.refusals(tuple(Node(n.name, labels=n.labels) for n in nodes))


def aff(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    e: dict[str, Any] = {"key": key, "operator": op}
    if values:
        e["values"] = list(values)
    return e


ZONED = [node("a", {"zone": "z1", "gpu": "A100", "rank": "3"}), node("b", {"zone": "z2", "gpu": "H100", "rank": "x"}),
         node("c", {"zone": "z1"})]


@pytest.mark.parametrize("spec,expect", [
    ({}, ["a", "b", "c"]),
    ({"nodeSelector": {"zone": "z1"}}, ["a", "c"]),
    ({"nodeSelector": {"zone": "z1", "gpu": "A100"}}, ["a"]),
    ({"nodeSelector": {"disktype": "ssd"}}, []),
    (aff({"matchExpressions": [expr("gpu", "In", "A100", "V100")]}), ["a"]),
    (aff({"matchExpressions": [expr("gpu", "NotIn", "A100")]}), ["b", "c"]),  # absent label matches NotIn
    (aff({"matchExpressions": [expr("gpu", "Exists")]}), ["a", "b"]),
    (aff({"matchExpressions": [expr("gpu", "DoesNotExist")]}), ["c"]),
    (aff({"matchExpressions": [expr("rank", "Gt", "2")]}), ["a"]),  # "x" is not an integer: no match
    (aff({"matchExpressions": [expr("rank", "Lt", "3")]}), []),
    # within a term ANDed, terms ORed
    (aff({"matchExpressions": [expr("zone", "In", "z1"), expr("gpu", "Exists")]}), ["a"]),
    (aff({"matchExpressions": [expr("gpu", "In", "H100")]}, {"matchExpressions": [expr("gpu", "DoesNotExist")]}),
     ["b", "c"]),
    (aff({"matchFields": [expr("metadata.name", "In", "c")]}), ["c"]),
    (aff({"matchFields": [expr("metadata.name", "NotIn", "c")]}), ["a", "b"]),
    # an empty term matches nothing
    (aff({}), []),
    # nodeSelector and affinity both apply
    ({"nodeSelector": {"zone": "z1"}, **aff({"matchExpressions": [expr("gpu", "Exists")]})}, ["a"]),
])
def test_node_selector_and_affinity(spec: dict[str, Any], expect: list[str]) -> None:
    assert feasible(spec, ZONED) == expect


def t(key: str = "", op: str = "Equal", value: str = "", effect: str = "", seconds: int | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {"operator": op}
    if key:
        d["key"] = key
    if value:
        d["value"] = value
    if effect:
        d["effect"] = effect
    if seconds is not None:
        d["tolerationSeconds"] = seconds
    return d


TAINTED = [
    node("plain"),
    node("maint", taints=[{"key": "maintenance", "value": "true", "effect": "NoSchedule"}]),
    node("exec", taints=[{"key": "dedicated", "value": "gpu", "effect": "NoExecute"}]),
    node("soft", taints=[{"key": "spot", "value": "yes", "effect": "PreferNoSchedule"}]),
]


@pytest.mark.parametrize("tolerations,expect", [
    ([], ["plain", "soft"]),
    ([t("maintenance", "Equal", "true", "NoSchedule")], ["plain", "maint", "soft"]),
    ([t("maintenance", "Equal", "false", "NoSchedule")], ["plain", "soft"]),
    ([t("maintenance", "Exists")], ["plain", "maint", "soft"]),  # any effect
    ([t("maintenance", "Exists", effect="NoExecute")], ["plain", "soft"]),  # wrong effect
    ([t(op="Exists")], ["plain", "maint", "exec", "soft"]),  # empty key + Exists: everything
    ([t("dedicated", "Equal", "gpu", "NoExecute", seconds=30)], ["plain", "exec", "soft"]),
])
def test_taints_and_tolerations(tolerations: list[dict[str, Any]], expect: list[str]) -> None:
    assert feasible({"tolerations": tolerations}, TAINTED) == expect


def test_prefer_no_schedule_only_scores() -> None:
    view = ClusterView()
    view.reset({n.name: n for n in TAINTED}, {}, [])
    c = constraint_for(None, False, view)
    assert c.score(Node("plain")) > c.score(Node("soft"))
    tolerant = constraint_for(scheduling_spec("d", {}, {"tolerations": [t("spot", "Exists")]}), False, view)
    assert tolerant.score(Node("soft")) == tolerant.score(Node("plain")) == 1.0


def test_lifecycle_taints_cordon_and_not_ready() -> None:
    nodes = [node("ok"), node("cordoned", unschedulable=True), node("down", ready=False)]
    assert feasible({}, nodes) == ["ok"]
    assert feasible({"tolerations": [t("node.kubernetes.io/unschedulable", "Exists", effect="NoSchedule")]},
                    nodes) == ["ok", "cordoned"]
    assert feasible({"tolerations": [t("node.kubernetes.io/not-ready", "Exists")]}, nodes) == ["ok", "down"]
    # an explicit not-ready taint is not doubled
    n = node("down2", [], [{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}], ready=False)
    assert [x.key for x in n.taints] == ["node.kubernetes.io/not-ready"]


def test_gpu_pods_wait_for_tessera_node_others_do_not() -> None:
    nodes = [node("gpu", gpu_closed="no tessera-node has reported"), node("cpu")]
    assert feasible({}, nodes, gpu=True) == ["cpu"]
    assert feasible({}, nodes, gpu=False) == ["gpu", "cpu"]


def pod(ns: str, labels: dict[str, str], where: str | None = None, *, ref: tuple[str, int] | None = None,
        spec: dict[str, Any] | None = None) -> OtherPod:
    sp = scheduling_spec(ns, labels, spec or {})
    return OtherPod(ns, labels, sp, node=where, ref=ref,
                    resources=dict(sp.resources) if sp else {}, ports=sp.host_ports if sp else ())


def anti(key: str, labels: dict[str, str], **kw: Any) -> dict[str, Any]:
    return {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": labels}, "topologyKey": key, **kw}]}}}


def pod_aff(key: str, labels: dict[str, str], **kw: Any) -> dict[str, Any]:
    return {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": labels}, "topologyKey": key, **kw}]}}}


HOSTS = [node("h1", {"zone": "z1"}), node("h2", {"zone": "z1"}), node("h3", {"zone": "z2"}), node("bare")]


def test_pod_anti_affinity_per_hostname_and_zone() -> None:
    web = [pod("default", {"app": "web"}, "h1")]
    assert feasible(anti("kubernetes.io/hostname", {"app": "web"}), HOSTS, web) == ["h2", "h3", "bare"]
    # a node without the topology label is no domain: anti-affinity does not exclude it
    assert feasible(anti("zone", {"app": "web"}), HOSTS, web) == ["h3", "bare"]
    # other namespace: not selected by default (own namespace only)
    other = [pod("other", {"app": "web"}, "h1")]
    assert feasible(anti("kubernetes.io/hostname", {"app": "web"}), HOSTS, other) == ["h1", "h2", "h3", "bare"]
    # namespaceSelector {} selects every namespace
    assert feasible(anti("kubernetes.io/hostname", {"app": "web"}, namespaceSelector={}), HOSTS, other) \
        == ["h2", "h3", "bare"]
    # namespaceSelector by labels
    nsl = {"other": {"team": "a"}}
    assert feasible(anti("kubernetes.io/hostname", {"app": "web"}, namespaceSelector={"matchLabels": {"team": "a"}}),
                    HOSTS, other, namespaces=nsl) == ["h2", "h3", "bare"]
    assert feasible(anti("kubernetes.io/hostname", {"app": "web"}, namespaces=["other"]), HOSTS, other) \
        == ["h2", "h3", "bare"]


def test_existing_pods_anti_affinity_is_symmetric() -> None:
    guard = [pod("default", {"app": "db"}, "h1", spec=anti("zone", {"app": "web"}))]
    assert feasible({}, HOSTS, guard, labels={"app": "web"}) == ["h3", "bare"]
    assert feasible({}, HOSTS, guard, labels={"app": "api"}) == ["h1", "h2", "h3", "bare"]


def test_pod_affinity_needs_a_peer_in_the_domain_except_the_first() -> None:
    cache = [pod("default", {"app": "cache"}, "h3")]
    assert feasible(pod_aff("zone", {"app": "cache"}), HOSTS, cache) == ["h3"]
    # no pod matches anywhere: allowed where the key exists only if the pod matches its own term
    assert feasible(pod_aff("zone", {"app": "cache"}), HOSTS, [], labels={"app": "cache"}) == ["h1", "h2", "h3"]
    assert feasible(pod_aff("zone", {"app": "cache"}), HOSTS, [], labels={"app": "web"}) == []


def test_gang_members_seen_as_placed_in_the_cycle() -> None:
    members = [pod("default", {"job": "g"}, ref=("g", 0)), pod("default", {"job": "g"}, ref=("g", 1))]
    spec = anti("kubernetes.io/hostname", {"job": "g"})
    assert feasible(spec, HOSTS, members, labels={"job": "g"}) == ["h1", "h2", "h3", "bare"]
    assert feasible(spec, HOSTS, members, labels={"job": "g"}, placed={("g", 0): "h2"}) == ["h1", "h3", "bare"]


def spread(key: str, skew: int = 1, when: str = "DoNotSchedule", **kw: Any) -> dict[str, Any]:
    return {"topologySpreadConstraints": [{"maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": when,
                                           "labelSelector": {"matchLabels": {"app": "s"}}, **kw}]}


def test_topology_spread_do_not_schedule() -> None:
    s = {"app": "s"}
    pods = [pod("default", s, "h1"), pod("default", s, "h2")]  # z1: 2, z2: 0
    assert feasible(spread("zone"), HOSTS, pods, labels=s) == ["h3"]  # bare lacks the key
    assert feasible(spread("zone", 2), HOSTS, pods, labels=s) == ["h3"]
    assert feasible(spread("zone", 3), HOSTS, pods, labels=s) == ["h1", "h2", "h3"]
    # minDomains 3 with only two zones: the global minimum counts as 0
    even = [pod("default", s, "h1"), pod("default", s, "h3")]
    assert feasible(spread("zone", 1, minDomains=3), HOSTS, even, labels=s) == []
    assert feasible(spread("zone", 1, minDomains=2), HOSTS, even, labels=s) == ["h1", "h2", "h3"]
    # ScheduleAnyway never filters
    assert feasible(spread("zone", when="ScheduleAnyway"), HOSTS, pods, labels=s) == ["h1", "h2", "h3", "bare"]
    # nodeAffinityPolicy Honor (default): a zone the pod cannot use is no domain
    only_z1 = {**spread("zone"), "nodeSelector": {"zone": "z1"}}
    assert feasible(only_z1, HOSTS, pods, labels=s) == ["h1", "h2"]
    ignore = {"topologySpreadConstraints": [{**spread("zone")["topologySpreadConstraints"][0],
                                             "nodeAffinityPolicy": "Ignore"}], "nodeSelector": {"zone": "z1"}}
    assert feasible(ignore, HOSTS, pods, labels=s) == []


def test_host_ports_and_extended_resources() -> None:
    nodes = [node("n1", resources={"example.com/fpga": 2000}), node("n2")]
    user = [pod("default", {}, "n1", spec={"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080}],
                                                          "resources": {"requests": {"example.com/fpga": "1"}}}]})]
    ports = {"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080, "hostIP": "10.0.0.1"}]}]}
    assert feasible(ports, nodes, user) == ["n2"]
    udp = {"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080, "protocol": "UDP"}]}]}
    assert feasible(udp, nodes, user) == ["n1", "n2"]
    fpga = {"containers": [{"name": "c", "resources": {"limits": {"example.com/fpga": "1"}}}]}
    assert feasible(fpga, nodes, user) == ["n1"]
    two = {"containers": [{"name": "c", "resources": {"requests": {"example.com/fpga": "2"}}}]}
    assert feasible(two, nodes, user) == []
    assert reasons(two, nodes, user) == "2 Insufficient example.com/fpga"


def test_refusals_count_per_reason() -> None:
    nodes = [node(f"n{i}", {"disktype": "hdd"}) for i in range(3)] + [
        node("m", {"disktype": "ssd"}, [{"key": "maintenance", "value": "true", "effect": "NoSchedule"}])]
    assert reasons({"nodeSelector": {"disktype": "ssd"}}, nodes) == (
        "3 didn't match nodeSelector disktype=ssd, 1 had untolerated taint maintenance=true:NoSchedule")


def test_preferred_node_affinity_scores_by_weight() -> None:
    view = ClusterView()
    view.reset({n.name: n for n in ZONED}, {}, [])
    spec = {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 80, "preference": {"matchExpressions": [expr("gpu", "In", "H100")]}},
        {"weight": 20, "preference": {"matchExpressions": [expr("zone", "In", "z1")]}}]}}}
    c = constraint_for(scheduling_spec("d", {}, spec), False, view)
    scores = {n.name: c.score(Node(n.name)) for n in ZONED}
    assert scores["b"] > scores["a"] == scores["c"] > 0


@pytest.mark.parametrize("spec,field", [
    (aff({"matchExpressions": [expr("gpu", "Foo", "x")]}),
     "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
     ".matchExpressions[0].operator"),
    (aff({"matchExpressions": [expr("rank", "Gt", "1", "2")]}),
     "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
     ".matchExpressions[0].values"),
    ({"tolerations": [t("k", "Maybe")]}, "spec.tolerations[0].operator"),
    ({"topologySpreadConstraints": [{"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]},
     "spec.topologySpreadConstraints[0].maxSkew"),
])
def test_malformed_constraints_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        scheduling_spec("d", {}, spec)
    assert exc.value.field == field


def test_no_constraint_stated_is_none() -> None:
    assert scheduling_spec("d", {"app": "x"}, {"containers": [{"name": "c", "resources": {
        "requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}}}]}) is None
    assert Taint("k", "", "NoSchedule").text() == "k:NoSchedule"


# ---- topology ----------------------------------------------------------------------------------

from tessera.core.model import GpuDevice, GpuRequest, ResourceRequest  # noqa: E402
from tessera.kube.admission import policy  # noqa: E402
from tessera.kube.predicates import topology as topo  # noqa: E402


@pytest.mark.parametrize("ann,key,required", [
    ({"tessera.io/topology-required": "rack"}, "tessera.io/topology-rack", True),
    ({"tessera.io/topology-preferred": "nvlink"}, "nvidia.com/gpu.clique", False),
    ({"tessera.io/topology-required": "zone"}, "topology.kubernetes.io/zone", True),
    ({"kai.scheduler/topology-required-placement": "cloud.provider.com/topology-rack"},
     "cloud.provider.com/topology-rack", True),
    ({"kai.scheduler/topology-preferred-placement": "kubernetes.io/hostname"}, "kubernetes.io/hostname", False),
])
def test_topology_annotations(ann: dict[str, str], key: str, required: bool) -> None:
    t = topo.topology_request(ann)
    assert t is not None and (t.key, t.required) == (key, required)


@pytest.mark.parametrize("ann,field", [
    ({"tessera.io/topology-required": "shelf"}, "tessera.io/topology-required"),
    ({"tessera.io/topology-preferred": ""}, "tessera.io/topology-preferred"),
    ({"kai.scheduler/topology-required-placement": "not a label!"}, "kai.scheduler/topology-required-placement"),
    ({"tessera.io/topology-required": "rack", "tessera.io/topology-preferred": "zone"},
     "tessera.io/topology-preferred"),
])
def test_bad_topology_annotation_names_it(ann: dict[str, str], field: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        topo.topology_request(ann)
    assert exc.value.field == field
    # the webhook refuses such a pod, naming the annotation
    with pytest.raises(InvalidRequest) as exc:
        policy.check_user_fields({"metadata": {"annotations": ann}, "spec": {"containers": []}})
    assert exc.value.field == field


def gpu_node(name: str, gpus: int = 2) -> Node:
    return Node(name, tuple(GpuDevice(f"{name}-{i}", i, 80 * 2**30, "A100-80GB") for i in range(gpus)))


def test_domain_is_the_smallest_with_room_for_the_whole_gang() -> None:
    nodes = {n: gpu_node(n) for n in ("a", "b", "c", "d")}
    labels = {"a": {"rack": "r1"}, "b": {"rack": "r2"}, "c": {"rack": "r2"}, "d": {"rack": "r3"}}
    want = topo.TopologyRequest("rack", True, topo.REQUIRED, "rack")
    one = ResourceRequest(GpuRequest.whole(1))

    def choose(n: int, used: dict[str, dict[int, tuple[int, bool]]] | None = None,
               running: list[str] | None = None) -> str | None:
        return topo.choose_domain(want, [one] * n, running or [], nodes, labels, lambda _: True,
                                  used or {}).value

    assert choose(2) in ("r1", "r3")  # two racks of 2 GPUs suffice: a small one
    assert choose(4) == "r2"
    assert choose(4, {"b": {0: (1, True)}}) == "r2"  # 3 left in r2, nowhere 4: the roomiest
    assert choose(1, running=["d"]) == "r3"  # where it already runs
    assert topo.choose_domain(want, [one], [], nodes, {}, lambda _: True, {}).value is None


def test_required_domain_filters_and_preferred_scores() -> None:
    nodes = [node("a", {"tessera.io/topology-rack": "r1"}), node("b", {"tessera.io/topology-rack": "r2"}),
             node("c")]
    view = ClusterView()
    view.reset({n.name: n for n in nodes}, {}, [])
    req = topo.Domain("tessera.io/topology-rack", "r2", True, "rack", topo.REQUIRED)
    c = constraint_for(None, True, view, domain=req)
    assert [n.name for n in nodes if c.allows(Node(n.name))] == ["b"]
    assert c.refusals(tuple(Node(n.name) for n in nodes)) == (
        "2 were outside the workload's rack r2 (tessera.io/topology-required)")
    soft = constraint_for(None, True, view, domain=topo.Domain(req.key, "r2", False, "rack", topo.PREFERRED))
    assert all(soft.allows(Node(n.name)) for n in nodes)
    assert soft.score(Node("b")) > soft.score(Node("a"))


def test_static_answers_kept_across_cycles_only_while_node_facts_and_filters_are_the_same() -> None:
    """A constraint kept between cycles (the snapshot keeps one per distinct pod spec) answers
    ``allows`` from its memo while the node's facts are the same object; a node whose facts
    changed (relabelled, now tainted or cordoned: a new NodeFacts) is asked again, and a cluster
    that newly needs another filter (a cordon anywhere) asks every node again."""
    a, b = node("a", {"disktype": "ssd"}), node("b")
    view = ClusterView()
    view.reset({"a": a, "b": b}, {}, [])
    c = constraint_for(scheduling_spec("default", {}, {"nodeSelector": {"disktype": "ssd"}}),
                       False, view)
    na, nb = Node("a"), Node("b")
    assert (c.allows(na), c.allows(nb)) == (True, False)
    view.reset({"a": a, "b": node("b", {"disktype": "ssd"})}, {}, [])  # next cycle: b relabelled
    assert (c.allows(na), c.allows(nb)) == (True, True)
    view.reset({"a": node("a", {"disktype": "ssd"}, unschedulable=True),
                "b": node("b", {"disktype": "ssd"})}, {}, [])  # a cordoned: one filter more
    assert (c.allows(na), c.allows(nb)) == (False, True)


def test_static_scores_kept_across_cycles_only_while_node_facts_are_the_same(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A preference that reads only the pod and the node's facts (preferred node affinity) is
    computed once per node while its facts are the same object, across cycles; a relabelled
    node (new NodeFacts) is scored again; a score that reads the placed pods (inter-pod
    affinity) is never kept."""
    from tessera.kube.predicates import constraint as constraint_mod

    calls: list[str] = []
    real = getattr(constraint_mod, "node_affinity_score")  # noqa: B009 (not re-exported)

    def counted(pod: Any, facts: NodeFacts) -> float | None:
        calls.append(facts.name)
        return real(pod, facts)

    monkeypatch.setattr(constraint_mod, "node_affinity_score", counted)
    a, b = node("a", {"disktype": "ssd"}), node("b")
    view = ClusterView()
    view.reset({"a": a, "b": b}, {}, [])
    spec = {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchExpressions": [expr("disktype", "In", "ssd")]}}]}}}
    c = constraint_for(scheduling_spec("default", {}, spec), False, view)
    na, nb = Node("a"), Node("b")
    assert (c.score(na), c.score(nb)) == (1.0, 0.0)
    view.reset({"a": a, "b": b}, {}, [])  # next cycle, same facts: answered from the memo
    assert (c.score(na), c.score(nb)) == (1.0, 0.0)
    assert calls == ["a", "b"]
    view.reset({"a": a, "b": node("b", {"disktype": "ssd"})}, {}, [])  # b relabelled
    assert (c.score(na), c.score(nb)) == (1.0, 1.0)
    assert calls == ["a", "b", "b"]
    anti = {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "x"}},
                                           "topologyKey": "kubernetes.io/hostname"}}]}}}
    d = constraint_for(scheduling_spec("default", {}, anti), False, view)
    d.score(na)
    assert not d._scored


def test_placer_keeps_a_constraints_node_vector_across_cycles_while_the_facts_stand(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The placer's per-constraint vector (allowed, preference per node) survives a warm
    cycle's ``forget_constraints`` while the constraint's ``static_token`` (the nodes' facts,
    the filters and scores planned) is unchanged: no node is asked again. A node given new
    facts (relabelled) makes every kept vector asked again, with the new answer; a constraint
    whose score reads the placed pods (inter-pod affinity) is never kept."""
    from tessera.core.placement import Placer
    from tessera.core.state import ClusterState

    asked: list[str] = []
    a, b = node("a", {"disktype": "ssd"}), node("b")
    view = ClusterView()
    view.reset({"a": a, "b": b}, {}, [])
    c = constraint_for(scheduling_spec("default", {}, {"nodeSelector": {"disktype": "ssd"}}),
                       False, view)
    real_allows = type(c).allows

    def counted(self: Any, n: Node) -> bool:
        asked.append(n.name)
        return real_allows(self, n)

    monkeypatch.setattr(type(c), "allows", counted)
    placer = Placer(ClusterState([Node("a"), Node("b")]))
    assert list(placer.static(c)[0]) == [1, 0] and asked == ["a", "b"]
    view.reset({"a": a, "b": b}, {}, [])  # next cycle, same facts objects
    placer.forget_constraints()
    again = constraint_for(scheduling_spec("default", {}, {"nodeSelector": {"disktype": "ssd"}}),
                           False, view)  # equal, as the snapshot builder's next one is
    assert list(placer.static(again)[0]) == [1, 0] and asked == ["a", "b"]
    view.reset({"a": a, "b": node("b", {"disktype": "ssd"})}, {}, [])  # b relabelled
    placer.forget_constraints()
    assert list(placer.static(again)[0]) == [1, 1] and asked == ["a", "b", "a", "b"]
    soft = constraint_for(scheduling_spec("default", {}, {"affinity": {"podAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 5, "podAffinityTerm": {
            "topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {
                "app": "x"}}}}]}}}), False, view)
    assert soft.static_token() is None
    placer.static(soft)
    view.reset({"a": a, "b": node("b", {"disktype": "ssd"})}, {}, [])
    placer.forget_constraints()
    asked.clear()
    placer.static(soft)
    assert asked == ["a", "b"]

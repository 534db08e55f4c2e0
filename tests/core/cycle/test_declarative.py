"""Table-driven scenarios (KAI's style): plain data in, expected bindings/evictions/waits out.

Nodes: ``{"n": count, "gpus": per node, "gib": device memory}``. Projects:
``name: (deserved, limit, weight, priority, parent)`` (trailing items optional). Workloads:
``id: {"p": project, "g": GPU (whole if ≥ 1, portion if < 1), ...}`` with ``on`` for running
pods, ``pods``/``min`` for gangs, ``cls``, ``mem`` (GiB request), ``dev`` (devices), ``limit``
(portion burst limit), ``t`` (started_at), ``c`` (created_at).
"""

from __future__ import annotations

from typing import Any

import pytest

from .scenario import bound, cycle, evicted, nodes, project, workload

SCENARIOS: list[dict[str, Any]] = [
    {
        "name": "walkthrough: team-a with 1 GPU runs 0.5 and 0.3 on the same GPU",
        "nodes": {"n": 1, "gpus": 1},
        "projects": {"team-a": (1,)},
        "workloads": {"frac05": {"p": "team-a", "g": 0.5, "cls": "build"}, "frac03": {"p": "team-a", "g": 0.3, "cls": "build"}},
        "bound": {"frac05": ["n1:0"], "frac03": ["n1:0"]},
    },
    {
        "name": "quickstart: two 0.5 trainings share one GPU",
        "nodes": {"n": 1, "gpus": 1},
        "projects": {"team-a": (1,)},
        "workloads": {"frac05": {"p": "team-a", "g": 0.5}, "frac05-2": {"p": "team-a", "g": 0.5}},
        "bound": {"frac05": ["n1:0"], "frac05-2": ["n1:0"]},
    },
    {
        "name": "dynamic fractions: four 0.25 requests with limit 1 on one GPU",
        "nodes": {"n": 1, "gpus": 1},
        "projects": {"a": (1,)},
        "workloads": {f"d{i}": {"p": "a", "g": 0.25, "limit": 1} for i in range(4)},
        "bound": {f"d{i}": ["n1:0"] for i in range(4)},
    },
    {
        "name": "multi-device memory request (cGPU) takes 4 devices of one node",
        "nodes": {"n": 2, "gpus": 4},
        "projects": {"a": (1,)},
        "workloads": {"busy": {"p": "a", "g": 0.5, "on": ["n1:0"]}, "c": {"p": "a", "mem": 2, "dev": 4}},
        "bound": {"c": ["n1:0,1,2,3"]},
    },
    {
        "name": "gang of 3 across nodes, all or nothing",
        "nodes": {"n": 3, "gpus": 1},
        "projects": {"a": (3,), "b": (0,)},
        "workloads": {"x": {"p": "b", "g": 1, "on": ["n3:0"], "cls": "inference"}, "g": {"p": "a", "g": 1, "pods": 3}},
        "bound": {},
        "waiting": {"g": "waiting for 1 of 3 gang members to fit"},
    },
    {
        "name": "limit",
        "nodes": {"n": 1, "gpus": 4},
        "projects": {"team-a": (1, 2)},
        "workloads": {"r": {"p": "team-a", "g": 2, "on": ["n1:0,1"]}, "p": {"p": "team-a", "g": 1}},
        "waiting": {"p": "project team-a is at its limit of 2 GPUs"},
    },
    {
        "name": "reclaim the newest over-quota training",
        "nodes": {"n": 1, "gpus": 2},
        "projects": {"a": (1,), "b": (1,)},
        "workloads": {
            "b1": {"p": "b", "g": 1, "on": ["n1:0"], "t": 1},
            "b2": {"p": "b", "g": 1, "on": ["n1:1"], "t": 2},
            "a1": {"p": "a", "g": 1},
        },
        "bound": {"a1": ["n1:1"]},
        "evicted": {"b2"},
    },
    {
        "name": "reclaim never takes non-preemptible",
        "nodes": {"n": 1, "gpus": 2},
        "projects": {"a": (1,), "b": (1,)},
        "workloads": {
            "b1": {"p": "b", "g": 1, "on": ["n1:0"], "cls": "inference"},
            "b2": {"p": "b", "g": 1, "on": ["n1:1"], "cls": "build"},
            "a1": {"p": "a", "g": 1},
        },
        "bound": {},
        "evicted": set(),
    },
    {
        "name": "reclaim between siblings in a department",
        "nodes": {"n": 1, "gpus": 2},
        "projects": {"d": (2,), "x": (1, None, 1, 100, "d"), "y": (1, None, 1, 100, "d")},
        "workloads": {
            "y1": {"p": "y", "g": 1, "on": ["n1:0"], "t": 1},
            "y2": {"p": "y", "g": 1, "on": ["n1:1"], "t": 2},
            "x1": {"p": "x", "g": 1},
        },
        "bound": {"x1": ["n1:1"]},
        "evicted": {"y2"},
    },
    {
        "name": "preempt lower priority in the same project",
        "nodes": {"n": 1, "gpus": 1},
        "projects": {"a": (1,)},
        "workloads": {"t": {"p": "a", "g": 0.5, "on": ["n1:0"]}, "t2": {"p": "a", "g": 0.5, "on": ["n1:0"]}, "i": {"p": "a", "g": 1, "cls": "inference"}},
        "bound": {"i": ["n1:0"]},
        "evicted": {"t", "t2"},
    },
    {
        "name": "min runtime protects from preemption",
        "nodes": {"n": 1, "gpus": 1},
        "projects": {"a": (1,)},
        "config": {"preempt_min_runtime": 600},
        "workloads": {"t": {"p": "a", "g": 1, "on": ["n1:0"], "t": 900}, "i": {"p": "a", "g": 1, "cls": "inference"}},
        "bound": {},
        "evicted": set(),
    },
    {
        "name": "consolidate two halves onto one GPU for a whole-GPU workload",
        "nodes": {"n": 2, "gpus": 1},
        "projects": {"a": (1,), "b": (1,)},
        "workloads": {"h1": {"p": "b", "g": 0.5, "on": ["n1:0"]}, "h2": {"p": "b", "g": 0.5, "on": ["n2:0"]}, "w": {"p": "a", "g": 1}},
        "bound": {"w": ["n1:0"]},
        "evicted": set(),
        "moves": 1,
    },
]


@pytest.mark.parametrize("case", SCENARIOS, ids=[c["name"] for c in SCENARIOS])
def test_scenario(case: dict[str, Any]) -> None:
    spec = case["nodes"]
    ns = nodes(spec["n"], gpus=spec["gpus"], memory_gib=spec.get("gib", 16))
    projects = []
    for name, q in case["projects"].items():
        deserved, limit, weight, priority, parent = (*q, *(None, 1.0, 100, None)[len(q) - 1 :])
        projects.append(project(name, deserved, limit=limit, weight=weight, priority=priority, parent=parent))
    workloads = [
        workload(
            ns, wid, w["p"], w.get("g"), pods=w.get("pods", 1), min_members=w.get("min"), cls=w.get("cls", "train"),
            on=w.get("on"), created=w.get("c", 0.0), started=w.get("t"), memory_gib=w.get("mem"),
            devices=w.get("dev", 1), limit=w.get("limit"),
        )
        for wid, w in case["workloads"].items()
    ]
    plan = cycle(ns, projects, workloads, **case.get("config", {}))
    if "bound" in case:
        assert bound(plan) == case["bound"]
    if "evicted" in case:
        assert evicted(plan) == case["evicted"]
    if "moves" in case:
        assert len(plan.moves) == case["moves"]
    for wid, prefix in case.get("waiting", {}).items():
        w = plan.waiting_for(wid)
        assert w is not None and w.reason.startswith(prefix), w

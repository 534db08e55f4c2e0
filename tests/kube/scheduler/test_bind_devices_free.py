"""The devices-free bind step (issue 27, item 8) alone, without a cluster: a whole-GPU pod's
binding waits while another pod on the node still holds one of its GPUs (a reservation pod being
deleted after a consolidation), goes on the moment it is gone, and fails naming the holder when
it stays past the timeout. (End to end with kwok: test_scheduler*.py's consolidations.)"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from types import SimpleNamespace
from typing import Any

import pytest

from tessera.core.state import Placement
from tessera.kube.bind import BindContext, bind_steps
from tessera.kube.bind.devices_free import DevicesFree
from tessera.kube.objects import PodInfo
from tessera.kube.parts import Options
from tessera.kube.podview import PodView


def pod(name: str, node: str | None = None, **kw: Any) -> PodInfo:
    return PodInfo("ns", name, f"uid-{name}", node, "Running" if node else "Pending", False, 0.0,
                   None, {}, {}, None, **kw)


def setup(cache: dict[Any, PodInfo], timeout: float = 5.0) -> DevicesFree:
    parts = SimpleNamespace(pods=PodView(cache), opts=Options(uuid_timeout=timeout))
    return DevicesFree(parts, poll=0.02)  # type: ignore[arg-type]


def whole(devices: tuple[int, ...]) -> Placement:
    return Placement("n1", devices=devices, request_bytes=(0,) * len(devices),
                     limit_bytes=(0,) * len(devices), exclusive=True)


def test_binding_waits_until_the_reservation_pod_holding_the_gpu_is_gone() -> None:
    cache: dict[Any, PodInfo] = {
        ("ns", "whole"): pod("whole"),
        ("ns", "res-1"): dataclasses.replace(pod("res-1", "n1", reservation=("n1", 1)),
                                             deleting=True),
        ("ns", "res-0-other-node"): pod("res-0-other-node", "n2", reservation=("n2", 0)),
        ("ns", "res-3"): pod("res-3", "n1", reservation=("n1", 3)),
    }
    step = setup(cache)
    ctx = BindContext(("ns", "whole"), whole((0, 1)), cache[("ns", "whole")])
    assert step.applies(ctx)

    async def go() -> float:
        async def remove() -> None:
            await asyncio.sleep(0.3)
            del cache[("ns", "res-1")]
        t0 = time.monotonic()
        await asyncio.gather(step.pre_bind(ctx), remove())
        return time.monotonic() - t0
    assert asyncio.run(go()) >= 0.3  # not bound while res-1 held GPU 1


def test_a_holder_that_stays_fails_the_binding_naming_it() -> None:
    share = dataclasses.replace(
        pod("share", "n1", placement=Placement("n1", devices=(2,), request_bytes=(1,),
                                               limit_bytes=(1,))), deleting=True)
    cache: dict[Any, PodInfo] = {("ns", "whole"): pod("whole"), ("ns", "share"): share}
    step = setup(cache, timeout=0.2)
    ctx = BindContext(("ns", "whole"), whole((2,)), cache[("ns", "whole")])
    with pytest.raises(RuntimeError, match=r"GPU\(s\) 2 of node n1 are still held by "
                                           r"ns/share \(terminating\)"):
        asyncio.run(step.pre_bind(ctx))


def test_finished_pods_and_shares_do_not_hold_and_shares_skip_the_step() -> None:
    done = dataclasses.replace(pod("done", "n1", reservation=("n1", 0)), phase="Succeeded")
    cache: dict[Any, PodInfo] = {("ns", "whole"): pod("whole"), ("ns", "done"): done}
    step = setup(cache, timeout=0.1)
    asyncio.run(step.pre_bind(BindContext(("ns", "whole"), whole((0,)), cache[("ns", "whole")])))
    shared = Placement("n1", devices=(0,), request_bytes=(1,), limit_bytes=(1,))
    assert not step.applies(BindContext(("ns", "whole"), shared, cache[("ns", "whole")]))


def test_the_step_runs_first() -> None:
    steps = bind_steps(SimpleNamespace(), SimpleNamespace())  # type: ignore[arg-type]
    assert isinstance(steps[0], DevicesFree)


def test_holders_come_from_the_informers_node_index_kept_through_moves_and_deletes() -> None:
    """The scheduler finds a node's pods through the pods informer's index (node -> keys), so a
    binding costs one node's pods, not the cluster's (a scan per binding was quadratic at 16,000
    pods). The index follows adds, moves and deletes, and the step's answer through
    it equals the scan's."""
    from tessera.kube.informer import Informer

    seen: list[Any] = []
    inf: Informer[PodInfo] = Informer(None, object, lambda p: p.key, lambda p: p,  # type: ignore[arg-type]
                                      lambda k, o, n: seen.append(k), index=lambda p: p.node or None)
    inf._apply("ADDED", pod("whole"))
    inf._apply("ADDED", pod("res-1", "n1", reservation=("n1", 1)))
    inf._apply("ADDED", pod("share", "n2", placement=Placement("n2", (0,), (1,), (1,))))
    assert inf.by == {"n1": {("ns", "res-1")}, "n2": {("ns", "share")}}
    inf._apply("MODIFIED", pod("share", "n1", placement=Placement("n1", (0,), (1,), (1,))))
    assert inf.by == {"n1": {("ns", "res-1"), ("ns", "share")}}
    with_index, scan = PodView(inf.items, inf.by), PodView(inf.items)
    for view in (with_index, scan):
        got = view.on_node("n1")
        assert sorted(k for k, _ in got) == [("ns", "res-1"), ("ns", "share")]
    step = setup(inf.items)
    step.parts.pods = with_index  # type: ignore[misc]
    ctx = BindContext(("ns", "whole"), whole((0, 1)), inf.items[("ns", "whole")])
    inf._apply("DELETED", pod("res-1", "n1", reservation=("n1", 1)))
    inf._apply("DELETED", pod("share", "n1"))
    assert inf.by == {} and with_index.on_node("n1") == []
    asyncio.run(step.pre_bind(ctx))  # nothing holds GPU 0 or 1 any more: binds at once
    assert len(seen) == 6

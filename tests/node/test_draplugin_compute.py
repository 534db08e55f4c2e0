"""DRA claims with a compute share (tessera.node.draplugin.compute): prepared, the claim's entry
is in its GPU's arbiter and gpu-compute.conf in its config directory (mounted at /etc/tessera,
where the library looks) before the kubelet hears the claim is ready; a node that cannot enforce
it refuses the claim (fails closed: no CDI spec); unprepared, the entry goes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tessera.isolation import arbiter
from tessera.node.compute_arbiters import arbiter_path
from tessera.node.draplugin import dra_pb2
from tessera.node.draplugin.cdi import PluginConfig
from tessera.node.draplugin.plugin import DraPlugin

UUID = "GPU-11111111-2222-3333-4444-555555555555"
UID = "0c6f7e4a-9d1e-4c2b-8a55-3f1d2e6b7a90"


def cfg(tmp_path: Path, **kw: Any) -> PluginConfig:
    base: dict[str, Any] = {"claims_dir": tmp_path / "claims", "loans_host_dir": tmp_path / "loans"}
    base.update(kw)
    return PluginConfig(node="n", uuids={0: UUID}, cdi_dir=tmp_path / "cdi", library_dir=tmp_path / "lib", **base)


def claim(compute: str | None = "400m") -> dict[str, Any]:
    consumed = {"memory": "5Gi", **({"compute": compute} if compute is not None else {})}
    return {"metadata": {"name": "c", "namespace": "ns", "uid": UID},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.tessera.io", "pool": "n", "device": "gpu-0",
                 "shareID": "s-1", "consumedCapacity": consumed}]}}}}


def prepare(plugin: DraPlugin) -> Any:
    req = dra_pb2.NodePrepareResourcesRequest(claims=[dra_pb2.Claim(namespace="ns", name="c", uid=UID)])
    return plugin.NodePrepareResources(req, None).claims[UID]


def test_a_claims_compute_share_is_in_its_gpus_arbiter_before_it_is_prepared(tmp_path: Path) -> None:
    c = cfg(tmp_path)
    got = prepare(DraPlugin(c, lambda ns, n: claim()))
    assert not got.error and len(got.devices) == 1
    conf = tmp_path / "claims" / UID / "conf" / "gpu-compute.conf"
    assert conf.read_text().splitlines()[1:] == [f"arbiter /run/tessera-loans/compute/{UUID}.share",
                                                 f"workload {UID}"]
    (u,) = arbiter.usage(arbiter_path(tmp_path / "loans", UUID))
    assert (u.key, round(u.request, 3), u.limit) == (UID, 0.4, 1.0)
    req = dra_pb2.NodeUnprepareResourcesRequest(claims=[dra_pb2.Claim(namespace="ns", name="c", uid=UID)])
    assert not DraPlugin(c, lambda ns, n: claim()).NodeUnprepareResources(req, None).claims[UID].error
    assert arbiter.usage(arbiter_path(tmp_path / "loans", UUID)) == []


def test_no_compute_capacity_no_conf(tmp_path: Path) -> None:
    got = prepare(DraPlugin(cfg(tmp_path), lambda ns, n: claim(None)))
    assert not got.error
    assert not (tmp_path / "claims" / UID / "conf" / "gpu-compute.conf").exists()


def test_a_node_that_cannot_enforce_it_refuses_the_claim(tmp_path: Path) -> None:
    got = prepare(DraPlugin(cfg(tmp_path, loans_host_dir=None), lambda ns, n: claim()))
    assert "consumedCapacity.compute" in got.error and "fails closed" in got.error
    assert not got.devices and not list((tmp_path / "cdi").glob("*"))
    (tmp_path / "loans2").write_text("not a directory")
    got = prepare(DraPlugin(cfg(tmp_path, loans_host_dir=tmp_path / "loans2"), lambda ns, n: claim()))
    assert "cannot be enforced" in got.error and not got.devices


def test_a_claims_compute_limit_is_written_into_its_arbiter_entry(tmp_path: Path) -> None:
    """The claim's opaque ComputeShare config (tessera.core.compute_claim) sets the entry's limit;
    a bad one refuses the claim, naming the field, with nothing written."""
    def limited(value: str) -> dict[str, Any]:
        c = claim("300m")
        c["spec"] = {"devices": {"config": [{"opaque": {"driver": "gpu.tessera.io", "parameters": {
            "apiVersion": "gpu.tessera.io/v1", "kind": "ComputeShare", "computeLimit": value}}}]}}
        return c

    got = prepare(DraPlugin(cfg(tmp_path), lambda ns, n: limited("700m")))
    assert not got.error
    (u,) = arbiter.usage(arbiter_path(tmp_path / "loans", UUID))
    assert (round(u.request, 3), round(u.limit, 3)) == (0.3, 0.7)

    bad = tmp_path / "bad"
    got = prepare(DraPlugin(cfg(bad), lambda ns, n: limited("100m")))
    assert "spec.devices.config[0].opaque.parameters.computeLimit" in got.error
    assert "at least the compute request" in got.error
    assert not (bad / "claims" / UID / "conf" / "gpu-compute.conf").exists()

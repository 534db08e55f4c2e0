"""DRA (issue 19, docs/dra.md) on the real API server: the example claims of docs/dra.md are
accepted as written and keep their capacity requests (DRAConsumableCapacity on); a capacity that
is not a quantity is refused by the API server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client, codecs
from lightkube.generic_resource import create_namespaced_resource

from tessera.testing.cluster import TestCluster
from tests.kube.dra_docs import doc_claims

ResourceClaim = create_namespaced_resource("resource.k8s.io", "v1", "ResourceClaim",
                                           "resourceclaims")


def test_docs_example_claims_are_accepted(kube_client: Client, kube_namespace: str) -> None:
    claims = doc_claims()
    assert {c["metadata"]["name"] for c in claims} == {"five-gib", "four-by-two", "quarter",
                                                       "whole"}
    for c in claims:
        c["metadata"]["namespace"] = kube_namespace
        kube_client.create(codecs.from_dict(c))
    got = kube_client.get(ResourceClaim, "five-gib", namespace=kube_namespace)
    exactly = got.spec["devices"]["requests"][0]["exactly"]
    assert exactly["capacity"] == {"requests": {"memory": "5Gi"}}  # dropped if the gate is off
    assert exactly["deviceClassName"] == "share.gpu.tessera.io"


def test_capacity_that_is_not_a_quantity_is_refused(kube_cluster: TestCluster,
                                                     kube_namespace: str) -> None:
    claim = doc_claims()[0]
    claim["metadata"] = {"name": "bad", "namespace": kube_namespace}
    claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] = "lots"
    assert kube_cluster.workdir is not None
    path = kube_cluster.workdir / "bad-claim.yaml"
    path.write_text(yaml.safe_dump(claim))
    out = kube_cluster.kubectl("create", "-f", str(path), check=False)
    assert out.returncode != 0
    assert "quantities must match" in out.stderr
    with pytest.raises(ApiError):
        kube_cluster.client().get(ResourceClaim, "bad", namespace=kube_namespace)


def test_allocation_status_is_accepted(kube_cluster: TestCluster, kube_client: Client,
                                       kube_namespace: str) -> None:
    """The status tessera.kube.claims writes for an allocation (devices, consumedCapacity,
    shareID, node selector, reservedFor) passes the API server's validation and is stored as
    written (fields of a disabled gate would be dropped)."""
    import json

    from tessera.core.model import GpuRequest
    from tessera.core.state import Placement
    from tessera.kube.claims import allocation_status, claim_gpu_request

    c = doc_claims()[1]  # four-by-two
    c["metadata"]["namespace"] = kube_namespace
    created = kube_client.create(codecs.from_dict(c)).to_dict()
    gpu = claim_gpu_request([created])
    assert gpu == GpuRequest.of_memory(2 * 2**30, devices=4)
    placement = Placement("node-x", devices=(0, 1, 2, 5), request_bytes=(2 * 2**30,) * 4,
                          limit_bytes=(2 * 2**30,) * 4)
    status = allocation_status(created, "gpus", placement, gpu, [("pod-x", "0b0b0b0b-1")])
    out = kube_cluster.kubectl("patch", "resourceclaim", "four-by-two", "-n", kube_namespace,
                               "--subresource=status", "--type=merge",
                               "-p", json.dumps({"status": status}), check=False)
    assert out.returncode == 0, out.stderr
    got = kube_client.get(ResourceClaim, "four-by-two", namespace=kube_namespace).status
    results = got["allocation"]["devices"]["results"]
    assert [r["device"] for r in results] == ["gpu-0", "gpu-1", "gpu-2", "gpu-5"]
    assert [r["shareID"] for r in results] == [
        r["shareID"] for r in status["allocation"]["devices"]["results"]]
    from tessera.core.units import parse_memory
    assert {parse_memory(r["consumedCapacity"]["memory"], "memory") for r in results} == {2**31}
    assert got["reservedFor"] == [{"resource": "pods", "name": "pod-x", "uid": "0b0b0b0b-1"}]


def test_kubelet_plugin_prepares_and_unprepares_over_grpc(
        kube_cluster: TestCluster, kube_client: Client, kube_namespace: str,
        tmp_path: Path) -> None:
    """A gRPC client playing the kubelet (kwok has none): registration GetInfo, then
    NodePrepareResources for a claim allocated on this node gives CDI devices whose spec carries
    the GPU and the limit the claim consumed; a claim of another node, or under a stale UID, is
    an error for that claim alone; prepare again is the same; unprepare removes the spec."""
    import json

    import grpc

    from tessera.core.model import GpuRequest
    from tessera.core.state import Placement
    from tessera.isolation.config import LIMIT_ENV
    from tessera.kube.claims import allocation_status
    from tessera.node.draplugin import dra_pb2, dra_pb2_grpc, registration_pb2
    from tessera.node.draplugin import registration_pb2_grpc as reg_grpc
    from tessera.node.draplugin.plugin import PluginConfig, serve

    ns = kube_namespace
    uids = {}
    for name, node in (("here", "node-p"), ("there", "node-q")):
        c = doc_claims()[1]  # four-by-two: 2Gi on each of 4 devices
        c["metadata"] = {"name": name, "namespace": ns}
        created = kube_client.create(codecs.from_dict(c)).to_dict()
        uids[name] = created["metadata"]["uid"]
        p = Placement(node, devices=(0, 1, 2, 3), request_bytes=(2 * 2**30,) * 4,
                      limit_bytes=(2 * 2**30,) * 4)
        status = allocation_status(created, "gpus", p, GpuRequest.of_memory(2 * 2**30, 4),
                                   [("pod", "0b0b")])
        out = kube_cluster.kubectl("patch", "resourceclaim", name, "-n", ns,
                                   "--subresource=status", "--type=merge",
                                   "-p", json.dumps({"status": status}), check=False)
        assert out.returncode == 0, out.stderr
    cfg = PluginConfig(node="node-p", uuids={i: f"GPU-{i}aaa" for i in range(4)},
                       cdi_dir=tmp_path / "cdi", library_dir=tmp_path / "lib")

    def get_claim(namespace: str, name: str) -> dict[str, Any]:
        return dict(kube_client.get(ResourceClaim, name, namespace=namespace).to_dict())

    server, reg = serve(cfg, get_claim, tmp_path / "dra.sock", tmp_path / "reg.sock")
    try:
        with grpc.insecure_channel(f"unix://{tmp_path / 'reg.sock'}") as ch:
            info = reg_grpc.RegistrationStub(ch).GetInfo(registration_pb2.InfoRequest())
            assert (info.type, info.name) == ("DRAPlugin", "gpu.tessera.io")
            assert list(info.supported_versions) == ["v1.DRAPlugin"]
            reg_grpc.RegistrationStub(ch).NotifyRegistrationStatus(
                registration_pb2.RegistrationStatus(plugin_registered=True))
        assert reg.status == (True, "")
        with grpc.insecure_channel(f"unix://{info.endpoint}") as ch:
            stub = dra_pb2_grpc.DRAPluginStub(ch)
            claims = [dra_pb2.Claim(namespace=ns, name="here", uid=uids["here"]),
                      dra_pb2.Claim(namespace=ns, name="there", uid=uids["there"]),
                      dra_pb2.Claim(namespace=ns, name="here", uid="stale-uid")]
            for _ in range(2):  # idempotent
                got = stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=claims))
                here = got.claims[uids["here"]]
                assert here.error == ""
                assert [d.device_name for d in here.devices] == [f"gpu-{i}" for i in range(4)]
                assert here.devices[0].cdi_device_ids == [
                    f"gpu.tessera.io/claim={uids['here']}-gpu-0"]
                assert here.devices[0].share_id
                assert "not this node" in got.claims[uids["there"]].error
                assert "UID" in got.claims["stale-uid"].error
            spec_file = cfg.cdi_dir / f"gpu.tessera.io-{uids['here']}.json"
            spec = json.loads(spec_file.read_text())
            # claim-wide: every GPU of the claim, in its order, and the library
            env = spec["containerEdits"]["env"]
            assert "NVIDIA_VISIBLE_DEVICES=GPU-0aaa,GPU-1aaa,GPU-2aaa,GPU-3aaa" in env
            assert "LD_PRELOAD=/usr/local/tessera/libtessera-cuda.so" in env, env
            assert spec["containerEdits"]["mounts"][0]["hostPath"] == str(cfg.library_dir)
            # per device: its limit at its visible index
            assert spec["devices"][2]["containerEdits"]["env"] == [f"{LIMIT_ENV}_2={2 * 2**30}"]
            assert not (cfg.cdi_dir / f"gpu.tessera.io-{uids['there']}.json").exists()
            stub.NodeUnprepareResources(dra_pb2.NodeUnprepareResourcesRequest(claims=claims[:1]))
            assert not spec_file.exists()
    finally:
        server.stop(None)

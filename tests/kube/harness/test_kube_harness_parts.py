"""The harness's pure parts: go.mod generation, node manifests, kubeconfigs (no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tessera.testing import binaries, pki
from tessera.testing.cluster import free_ports, kubeconfig_text
from tessera.testing.gpu_nodes import (
    GPU_UUIDS_ANNOTATION,
    KWOK_ANNOTATION,
    NodeShape,
    gpu_uuids,
    node_manifest,
)

KUBERNETES_GO_MOD = """module k8s.io/kubernetes

go 1.26.0

require (
\tk8s.io/api v0.0.0
\tgo.etcd.io/etcd/client/v3 v3.6.8
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go // comment
\tgithub.com/example/fork v1.2.0 => github.com/other/fork v1.2.1
)
replace k8s.io/streaming => ./staging/src/k8s.io/streaming
"""


def test_local_replaces_finds_only_directory_targets() -> None:
    assert binaries.local_replaces(KUBERNETES_GO_MOD) == {
        "k8s.io/api": "./staging/src/k8s.io/api",
        "k8s.io/client-go": "./staging/src/k8s.io/client-go",
        "k8s.io/streaming": "./staging/src/k8s.io/streaming",
    }
    assert binaries.go_directive(KUBERNETES_GO_MOD) == "1.26.0"


def test_staging_version_maps_v1_to_v0() -> None:
    assert binaries.kubernetes_staging_version("v1.36.3") == "v0.36.3"
    with pytest.raises(binaries.BuildError, match=r"v1\.Y\.Z"):
        binaries.kubernetes_staging_version("1.36.3")


def test_throwaway_go_mod_requires_release_and_pins_each_replace() -> None:
    text = binaries.throwaway_go_mod(
        require="k8s.io/kubernetes",
        version="v1.36.3",
        go_version="1.26.0",
        replaces={"k8s.io/client-go": "v0.36.3", "k8s.io/api": "v0.36.3"},
    )
    assert "require k8s.io/kubernetes v1.36.3" in text
    assert "\tk8s.io/api => k8s.io/api v0.36.3\n\tk8s.io/client-go => k8s.io/client-go v0.36.3" in text
    assert "\ngo 1.26.0\n" in text


def test_binary_paths_are_keyed_by_version(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TESSERA_CACHE", str(tmp_path))
    b = binaries.BINARIES["kube-apiserver"]
    assert b.path == tmp_path / "bin" / f"kube-apiserver-{binaries.KUBERNETES_VERSION}"
    # (not "kubelet": importing tessera.testing.node_binaries registers it, so whether it is
    # known depended on which modules the session had imported before)
    with pytest.raises(binaries.BuildError, match="unknown binary 'no-such-binary'"):
        binaries.ensure(["no-such-binary"])


def test_node_manifest_shape() -> None:
    m = node_manifest("n-3", NodeShape(gpus=4, model="A100-40GB"), index=3)
    assert m["status"]["capacity"]["nvidia.com/gpu"] == "4"
    assert m["status"]["allocatable"] == m["status"]["capacity"]
    assert m["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert m["metadata"]["labels"]["nvidia.com/gpu.memory"] == "40960"
    assert m["metadata"]["annotations"][KWOK_ANNOTATION] == "fake"
    uuids = m["metadata"]["annotations"][GPU_UUIDS_ANNOTATION].split(",")
    assert uuids == gpu_uuids("n-3", 4) and len(set(uuids)) == 4
    assert gpu_uuids("n-3", 4) != gpu_uuids("n-4", 4)


def test_node_shape_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="--gpu-model"):
        NodeShape(model="H100-81GB")
    with pytest.raises(ValueError, match="--gpus-per-node"):
        NodeShape(gpus=-1)


def test_kubeconfig_embeds_credentials(tmp_path: Path) -> None:
    p = pki.generate(tmp_path)
    doc = yaml.safe_load(
        kubeconfig_text("https://127.0.0.1:1", p.ca_cert, user="u", token="abc", namespace="ns")
    )
    assert doc["users"][0]["user"] == {"token": "abc"}
    assert doc["contexts"][0]["context"]["namespace"] == "ns"
    with pytest.raises(ValueError, match="token"):
        kubeconfig_text("https://127.0.0.1:1", p.ca_cert, user="u")


def test_free_ports_are_distinct() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5 and all(p > 0 for p in ports)


def test_free_ports_never_hands_out_a_port_twice() -> None:
    """A chosen port stays only a number until its component binds it, sometimes minutes later
    (a Helm value): a later caller in the same test process must not get it too. Choosing 400
    ports the plain way (bind to port 0, close) repeated ports 9 times here."""
    ports = [p for _ in range(200) for p in free_ports(2)]
    assert len(set(ports)) == len(ports)

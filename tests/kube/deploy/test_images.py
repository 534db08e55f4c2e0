"""tessera's OCI images (scripts/image_build.py, `./dev image`), checked without a container
runtime: each image is unpacked (umoci) and its programs run under chroot in a private mount
namespace, as the image's user, on a read-only root (tessera.testing.oci).

What this proves: the archives are valid OCI images whose digests are what the build prints;
the files in them (Debian's python3, the venv with tessera and every dependency, the isolation
library) are enough to run every entry point; the webhook serves TLS and becomes ready, and the
scheduler wins its Lease, against the real test API server with in-cluster credentials (a
ServiceAccount token mounted where Kubernetes mounts it), as the non-root user on a read-only
root; the layers hold no build tools, caches, wheels or private keys. What it does not prove:
that a container runtime starts them (no runtime runs here: namespaces other than mount,
cgroups, seccomp and capability drops are not exercised), nor anything on a GPU.

The build runs once per input hash (source, pyproject, native, the built library) and is cached
under ~/.cache/tessera/images; the first build takes a few minutes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from lightkube import Client
from lightkube.resources.coordination_v1 import Lease

from tessera.testing import oci
from tessera.testing import webhook as local
from tessera.testing.cluster import TestCluster, free_ports
from tests.kube import image_fixtures

ROOT = Path(__file__).resolve().parents[3]
NS = "images-test"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

pytestmark = image_fixtures.skip_without_images("tests/kube/deploy/test_images.py")


def _archive(built: dict[str, Any], name: str) -> Path:
    return Path(built["dir"]) / built["images"][name]["archive"]


def test_archives_are_oci_images_with_the_printed_digests(built: dict[str, Any]) -> None:
    assert set(built["images"]) == {"tessera", "tessera-node"}
    for name, img in built["images"].items():
        with tarfile.open(_archive(built, name)) as t:
            assert json.load(t.extractfile("oci-layout"))["imageLayoutVersion"] == "1.0.0"  # type: ignore[arg-type]
            index = json.load(t.extractfile("index.json"))  # type: ignore[arg-type]
            (manifest_desc,) = index["manifests"]
            assert manifest_desc["digest"] == img["digest"]
            blob = t.extractfile("blobs/" + img["digest"].replace(":", "/"))
            assert blob is not None
            data = blob.read()
            assert "sha256:" + hashlib.sha256(data).hexdigest() == img["digest"]
            manifest = json.loads(data)
            for layer in manifest["layers"]:
                assert layer["mediaType"].endswith("tar+gzip")
        assert img["reference"] == f"ghcr.io/tessera-gpu/{name}:0.1.0"
    # The control plane stays small (issue 17: under 200 MB compressed).
    assert built["images"]["tessera"]["compressed_bytes"] < 200e6, built["images"]


def test_package_list_and_sbom_name_exact_versions(built: dict[str, Any]) -> None:
    text = (Path(built["dir"]) / "packages.txt").read_text()
    lines = [x for x in text.splitlines() if x and not x.startswith("#")]
    deb = {x.split("=")[0]: x.split("=", 1)[1] for x in lines if "==" not in x}
    py = {x.split("==")[0].lower(): x.split("==")[1] for x in lines if "==" in x}
    assert deb["python3.11-minimal"] and deb["libc6"] and "python3-venv" not in deb
    assert py["tessera"] == "0.1.0" and {"fastapi", "lightkube", "pydantic", "grpcio"} <= set(py)
    assert "pip" not in py and "setuptools" not in py  # no installer left in the image
    sbom = json.loads((Path(built["dir"]) / "sbom.cdx.json").read_text())
    assert sbom["bomFormat"] == "CycloneDX"
    purls = {c["purl"] for c in sbom["components"]}
    assert "pkg:pypi/tessera@0.1.0" in purls
    assert any(p.startswith("pkg:deb/debian/libc6@") for p in purls)


# a PEM private key: the header and a base64 body (code that merely names the header, as
# cryptography's serializers do, has no body after it)
PEM_KEY = re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----\r?\n[A-Za-z0-9+/=\r\n]{64,}")
LEFTOVERS = ("tmp/", "root/.cache", "var/cache/apt/archives/", "var/lib/apt/lists/",
             "usr/bin/gcc", "usr/bin/make", "usr/bin/apt", ".git/", "etc/machine-id")


def test_layers_hold_no_build_leftovers_or_secrets(built: dict[str, Any]) -> None:
    for name in built["images"]:
        members = oci.layer_members(_archive(built, name))
        paths = [m[0] for m in members]
        assert any(p.endswith("bin/tessera-scheduler") for p in paths)
        bad = [p for p in paths if p.endswith((".whl", ".deb", ".pem.key"))
               or any(p.startswith(x) and p != x.rstrip("/") for x in LEFTOVERS)
               or "/site-packages/pip/" in p or "/site-packages/setuptools/" in p]
        assert not bad, f"{name}: leftovers {bad[:10]}"
        devices = [p for p, _m, _u, _s, kind in members
                   if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE)]
        assert not devices, f"{name}: device nodes {devices[:10]}"  # the runtime makes /dev
        world_writable = [p for p, mode, _uid, _size, kind in members
                          if mode & 0o002 and not (mode & 0o1000) and kind != tarfile.SYMTYPE]
        assert not world_writable, world_writable[:10]
        owners = {p for p, _mode, uid, _size, _kind in members if uid != 0}
        assert owners <= {"home/nonroot", "home/nonroot/"}, owners
    # no private key anywhere (the CA bundle holds certificates only)
    with tarfile.open(_archive(built, "tessera")) as t:
        index = json.load(t.extractfile("index.json"))  # type: ignore[arg-type]
        manifest = json.load(t.extractfile(  # type: ignore[arg-type]
            "blobs/" + index["manifests"][0]["digest"].replace(":", "/")))
        for layer in manifest["layers"]:
            f = t.extractfile("blobs/" + layer["digest"].replace(":", "/"))
            with tarfile.open(fileobj=f, mode="r|*") as lt:
                for m in lt:
                    if m.isfile() and m.size < 2_000_000:
                        data = lt.extractfile(m).read()  # type: ignore[union-attr]
                        assert not PEM_KEY.search(data), m.name


def test_images_run_as_the_documented_users(images: dict[str, oci.UnpackedImage]) -> None:
    assert images["tessera"].user == (65532, 65532)
    assert images["tessera-node"].user == (0, 0)
    out = images["tessera"].run(["id", "-u"])
    assert out.stdout.strip() == "65532", out.stderr
    out = images["tessera"].run(["sh", "-c", "touch /opt/x 2>&1; echo rc=$?"])
    assert "Read-only file system" in out.stdout  # the root is read-only, as the chart mounts it


@pytest.mark.parametrize(("image", "argv", "says"), image_fixtures.ENTRY_POINTS)
def test_every_entry_point_starts_from_the_image(images: dict[str, oci.UnpackedImage],
                                                 image: str, argv: list[str], says: str) -> None:
    out = images[image].run(argv)
    assert out.returncode == 0, out.stdout + out.stderr
    assert says in out.stdout


def test_node_image_holds_the_isolation_library(images: dict[str, oci.UnpackedImage]) -> None:
    lib = images["tessera-node"].rootfs / "usr/local/lib/tessera/libtessera-cuda.so"
    target = images["tessera-node"].rootfs / str(os.readlink(lib)).lstrip("/")
    data = target.read_bytes()
    assert data[:4] == b"\x7fELF" and b"cuMemAlloc_v2" in data
    src = ROOT / "src/tessera/isolation/lib/libtessera-cuda.so"
    assert hashlib.sha256(data).digest() == hashlib.sha256(src.read_bytes()).digest()


# ---- real start-ups against the test API server, with in-cluster credentials -----------------
def _service_account_dir(cluster: TestCluster, tmp: Path, name: str) -> Path:
    """What the kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount."""
    kubeconfig = cluster.service_account_kubeconfig(NS, name)
    import yaml

    doc = yaml.safe_load(kubeconfig.read_text())
    d = tmp / f"sa-{name}"
    d.mkdir(mode=0o755)
    (d / "token").write_text(doc["users"][0]["user"]["token"])
    assert cluster.pki is not None
    (d / "ca.crt").write_bytes(cluster.pki.ca_cert.read_bytes())
    (d / "namespace").write_text(NS)
    for f in d.iterdir():
        f.chmod(0o644)
    return d


def _grant(cluster: TestCluster, component: str, sa: str) -> None:
    """The chart's ClusterRole for ``component``, bound to ServiceAccount NS/sa (own names, so the
    chart's objects other tests apply stay untouched)."""
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                    "crd/projects.tessera.io", "crd/podgroups.tessera.io")
    docs = local.helm_template(namespace=NS)
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == component)
    role["metadata"] = {"name": f"{NS}-{component}"}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": f"{NS}-{component}"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": f"{NS}-{component}"},
               "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": NS}]}
    local.apply(cluster, [role, binding])


def _in_cluster_env(cluster: TestCluster) -> dict[str, str]:
    port = cluster.server.rsplit(":", 1)[1]
    return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}


def _start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    return proc.returncode


def test_webhook_from_the_image_serves_tls_and_gets_ready(
        images: dict[str, oci.UnpackedImage], kube_cluster: TestCluster, tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    _grant(kube_cluster, "tessera-webhook", "tessera-webhook")
    sa = _service_account_dir(kube_cluster, tmp_path, "tessera-webhook")
    cert, key, _ca = kube_cluster.issue_serving_cert("image-webhook")
    tls = tmp_path / "tls"
    tls.mkdir(mode=0o755)
    (tls / "tls.crt").write_bytes(cert.read_bytes())
    (tls / "tls.key").write_bytes(key.read_bytes())
    for f in tls.iterdir():
        f.chmod(0o644)
    (port,) = free_ports(1)
    cmd = images["tessera"].command(
        ["tessera-webhook", "--cert=/tls/tls.crt", "--key=/tls/tls.key", f"--port={port}",
         "--host=127.0.0.1"],
        env=_in_cluster_env(kube_cluster), mounts={"/tls": tls, SA_DIR: sa})
    proc = _start(cmd, tmp_path / "webhook.log")
    try:
        assert kube_cluster.pki is not None
        verify = ssl.create_default_context(cafile=str(kube_cluster.pki.ca_cert))
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "webhook.log").read_text()
            try:
                r = httpx.get(f"https://127.0.0.1:{port}/readyz", verify=verify, timeout=2)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "webhook.log").read_text()
            time.sleep(0.2)
        # a real AdmissionReview through TLS: a Run:ai fraction is mutated
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": "1", "operation": "CREATE", "namespace": NS,
                              "kind": {"group": "", "version": "v1", "kind": "Pod"},
                              "resource": {"group": "", "version": "v1", "resource": "pods"},
                              "userInfo": {"username": "someone"},
                              "object": {"apiVersion": "v1", "kind": "Pod",
                                         "metadata": {"name": "p", "namespace": NS,
                                                      "annotations": {"gpu-fraction": "0.5"}},
                                         "spec": {"containers": [{"name": "c", "image": "x"}]}}}}
        r = httpx.post(f"https://127.0.0.1:{port}/mutate", json=review, verify=verify, timeout=10)
        assert r.status_code == 200 and r.json()["response"]["uid"] == "1"
    finally:
        code = _stop(proc)
    log = (tmp_path / "webhook.log").read_text()
    assert code in (0, -15), log


def test_scheduler_from_the_image_connects_and_wins_its_lease(
        images: dict[str, oci.UnpackedImage], kube_cluster: TestCluster, kube_client: Client,
        tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    _grant(kube_cluster, "tessera-scheduler", "tessera-scheduler")
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "lease", "namespace": NS},
            "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                       "verbs": ["get", "create", "update"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "lease", "namespace": NS},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lease"},
               "subjects": [{"kind": "ServiceAccount", "name": "tessera-scheduler", "namespace": NS}]}
    sa = _service_account_dir(kube_cluster, tmp_path, "tessera-scheduler")
    local.apply(kube_cluster, [role, binding])
    (health,) = free_ports(1)
    cmd = images["tessera"].command(
        ["tessera-scheduler", f"--system-namespace={NS}", "--leader-elect",
         "--lease-name=image-test", "--identity=from-the-image", "--lease-duration=6",
         f"--health-port={health}", "--health-address=127.0.0.1", "--min-runtime-seconds=60"],
        env=_in_cluster_env(kube_cluster), mounts={SA_DIR: sa})
    proc = _start(cmd, tmp_path / "scheduler.log")
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "scheduler.log").read_text()
            try:
                lease = kube_client.get(Lease, "image-test", namespace=NS)
                if lease.spec and lease.spec.holderIdentity == "from-the-image":
                    break
            except Exception:
                pass
            assert time.monotonic() < deadline, (tmp_path / "scheduler.log").read_text()
            time.sleep(0.3)
        r = httpx.get(f"http://127.0.0.1:{health}/healthz", timeout=5)
        assert r.status_code == 200 and r.text == "ok"
    finally:
        code = _stop(proc)
    assert code == 0, (tmp_path / "scheduler.log").read_text()
    lease = kube_client.get(Lease, "image-test", namespace=NS)
    assert lease.spec is not None and not lease.spec.holderIdentity  # released on SIGTERM


def test_second_build_with_the_same_inputs_is_the_cached_one(built: dict[str, Any],
                                                            tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "image_build.py"), "--json",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    again = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "cached: inputs" in proc.stderr and again["inputs"] == built["inputs"]
    assert {n: i["digest"] for n, i in again["images"].items()} == \
        {n: i["digest"] for n, i in built["images"].items()}

"""The two container images the real-node tier runs, written as OCI image layouts (no registry,
no image builder): containerd imports them (``ctr images import``) and the kubelet runs them
with ``imagePullPolicy: Never``.

- ``tessera.local/pause:3.10``: Kubernetes' own ``build/pause/linux/pause.c`` from the release
  the cluster runs (in the Go module cache since kubelet was built), linked statically.
- ``tessera.local/probe:1``: a CUDA client image. It holds ``/bin/sh`` (dash), ``sleep``,
  ``cat``, and the project's ``cuprobe`` test program (one CUDA call per line on stdin), each
  with the shared libraries it links, copied from this machine. It holds no CUDA driver: as on a
  GPU node, the driver comes from the node (here the fake driver, mounted by the test pod the way
  the NVIDIA container toolkit mounts the real one), and tessera's library comes from its CDI
  spec or the webhook's mounts.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

PAUSE_IMAGE = "tessera.local/pause:3.10"
PROBE_IMAGE = "tessera.local/probe:1"
PROBE_DIR = "/opt/tessera-test"


class NodeImageError(RuntimeError):
    pass


def _libraries(binary: Path) -> list[Path]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False).stdout
    found = []
    for line in out.splitlines():
        parts = line.split()
        for part in parts:
            if part.startswith("/") and Path(part).exists():
                found.append(Path(part))
    return found


def _layer(files: dict[str, Path], dirs: list[str], extra: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in dirs:
            info = tarfile.TarInfo(d.lstrip("/"))
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "/tmp" else 0o755
            tar.addfile(info)
        for target, source in sorted(files.items()):
            real = source.resolve()
            info = tarfile.TarInfo(target.lstrip("/"))
            info.size, info.mode = real.stat().st_size, 0o755
            with real.open("rb") as fh:
                tar.addfile(info, fh)
        for target, data in extra.items():
            info = tarfile.TarInfo(target.lstrip("/"))
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_layout(out: Path, ref: str, layer: bytes, entrypoint: list[str]) -> Path:
    """An OCI image layout tar at ``out`` holding one image named ``ref``."""
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> dict[str, object]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"digest": digest, "size": len(data)}

    compressed = gzip.compress(layer, mtime=0)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin:/usr/bin"],
                         "WorkingDir": "/"},
              "rootfs": {"type": "layers", "diff_ids": [diff_id]}}
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           **blob(json.dumps(config).encode())},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                            **blob(compressed)}]}
    mdesc = blob(json.dumps(manifest).encode())
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", **mdesc,
        "annotations": {"org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1],
                        "io.containerd.image.name": ref}}]}
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        add("oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
        add("index.json", json.dumps(index).encode())
        for digest, data in blobs.items():
            add(f"blobs/sha256/{digest.split(':')[1]}", data)
    return out


def pause_image(out_dir: Path, pause_c: Path) -> Path:
    binary = out_dir / "pause"
    proc = subprocess.run(["gcc", "-Os", "-static", "-o", str(binary), str(pause_c)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise NodeImageError(f"gcc -static {pause_c} failed: {proc.stderr[-2000:]}")
    return write_layout(out_dir / "pause.oci.tar", PAUSE_IMAGE,
                        _layer({"/pause": binary}, [], {}), ["/pause"])


def probe_image(out_dir: Path, cuprobe: Path) -> Path:
    programs = {"/bin/sh": Path(shutil.which("dash") or "/bin/dash"),
                "/bin/sleep": Path(shutil.which("sleep") or "/bin/sleep"),
                "/bin/cat": Path(shutil.which("cat") or "/bin/cat"),
                f"{PROBE_DIR}/cuprobe": cuprobe}
    files = dict(programs)
    for prog in programs.values():
        for lib in _libraries(prog):
            files[str(lib)] = lib
    dirs = sorted({str(Path(t).parent) for t in files} | {"/tmp", "/etc", "/proc", "/dev",
                                                          "/sys", "/etc/tessera", "/run"})
    expanded: set[str] = set()
    for d in dirs:
        p = Path(d)
        while str(p) != "/":
            expanded.add(str(p))
            p = p.parent
    passwd = b"root:x:0:0:root:/:/bin/sh\nprobe:x:4321:4321:probe:/tmp:/bin/sh\n"
    layer = _layer(files, sorted(expanded), {"/etc/passwd": passwd,
                                              "/etc/group": b"root:x:0:\nprobe:x:4321:\n"})
    return write_layout(out_dir / "probe.oci.tar", PROBE_IMAGE, layer, ["/bin/sh", "-c"])


def kubernetes_pause_source(kubernetes_version: str) -> Path:
    """``build/pause/linux/pause.c`` of the Kubernetes release in the Go module cache."""
    out = subprocess.run(["go", "mod", "download", "-json", f"k8s.io/kubernetes@{kubernetes_version}"],
                         capture_output=True, text=True, check=False,
                         env={**os.environ, "GOFLAGS": "-mod=mod"})
    try:
        source = Path(json.loads(out.stdout)["Dir"]) / "build" / "pause" / "linux" / "pause.c"
    except (ValueError, KeyError) as exc:
        raise NodeImageError(f"go mod download k8s.io/kubernetes@{kubernetes_version}: "
                             f"{out.stdout[-500:]}{out.stderr[-500:]}") from exc
    if not source.is_file():
        raise NodeImageError(f"{source} is missing from the module cache")
    return source

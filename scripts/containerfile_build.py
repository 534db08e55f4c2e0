"""Build tessera's images from the Containerfiles (deploy/images/) with buildah, here.

    ./dev image --containerfiles [--out DIR]   (or: .venv/bin/python scripts/containerfile_build.py)

This is the build anyone runs with `docker build` / `podman build`, checked on a machine where no
container runs and no registry answers:
  * the Containerfiles' `FROM ${DEBIAN}` base cannot be pulled, so a Debian bookworm base is made
    from Debian's archive with mmdebstrap (variant minbase, no docs: what debian:bookworm-slim
    holds) and imported into buildah's local storage as localhost/debian:bookworm-slim, once;
  * `RUN` steps run with `buildah build --isolation chroot` (no OCI runtime, no namespaces a
    container engine would need), so apt-get and pip really run as the Containerfile says;
  * behind a TLS-intercepting proxy the CA bundle of this machine is handed to pip as a build
    secret (`--secret id=ca-bundle`), which no layer keeps;
  * both images are written as OCI archives (`buildah push ... oci-archive:`) and the digests
    printed; the last line is one JSON object.

tests/kube/deploy/test_containerfile_build.py unpacks the archives and starts every entry point from
them with chroot, as tests/kube/deploy/test_images.py does for `./dev image`.
Needs root, buildah, mmdebstrap (scripts/setup.d/40-image-tools.sh installs them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIRROR = os.environ.get("TESSERA_DEBIAN_MIRROR", "http://deb.debian.org/debian")
BASE = "localhost/debian:bookworm-slim"
SLIM_EXCLUDES = ["/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*",
                 "/usr/share/doc/*", "/usr/share/lintian/*"]
IMAGES = {  # name: (Containerfile, build args given the other images' local tags)
    "tessera": ("deploy/images/Containerfile", {"DEBIAN": BASE}),
    "tessera-node": ("deploy/images/Containerfile.node", {"DEBIAN": BASE,
                                                           "CONTROL_PLANE": "localhost/tessera:build"}),
}


def say(msg: str) -> None:
    print(f"[containerfile] {msg}", file=sys.stderr, flush=True)


def why_not() -> str | None:
    """None where this build can run here, else the reason."""
    if os.geteuid() != 0:
        return "needs root (buildah's chroot isolation, mmdebstrap in root mode)"
    for tool in ("buildah", "mmdebstrap"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (scripts/setup.d/40-image-tools.sh installs it)"
    return None


def run(argv: list[str], log: Path | None = None) -> str:
    out = subprocess.run(argv, capture_output=True, text=True)
    if log is not None:
        log.write_text(out.stdout + out.stderr)
    if out.returncode != 0:
        tail = (out.stdout + out.stderr)[-3000:]
        raise SystemExit(f"{' '.join(argv[:3])} ... failed ({out.returncode}):\n{tail}")
    return out.stdout


def has_image(ref: str) -> bool:
    return subprocess.run(["buildah", "inspect", "--type", "image", ref],
                          capture_output=True).returncode == 0


def make_base(work: Path) -> None:
    if has_image(BASE):
        return
    t0 = time.monotonic()
    say(f"making {BASE} from Debian's archive with mmdebstrap (about a minute)")
    rootfs = work / "base.tar"
    run(["mmdebstrap", "--variant=minbase", "--include=ca-certificates",
         *[f"--dpkgopt=path-exclude={p}" for p in SLIM_EXCLUDES],
         "--dpkgopt=path-include=/usr/share/doc/*/copyright",
         "bookworm", str(rootfs), MIRROR])
    ctr = run(["buildah", "from", "scratch"]).strip()
    try:
        run(["buildah", "add", ctr, str(rootfs), "/"])
        run(["buildah", "commit", "-q", ctr, BASE])
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True)
    say(f"base made in {time.monotonic() - t0:.0f} s")


def ca_bundle() -> str | None:
    for var in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        path = os.environ.get(var)
        if path and Path(path).is_file():
            return path
    return None


def build(name: str, out: Path) -> dict[str, object]:
    containerfile, args = IMAGES[name]
    tag = f"localhost/{name}:build"
    argv = ["buildah", "build", "--isolation", "chroot", "--pull=never", "--layers",
            "-f", containerfile, "-t", tag]
    for key, value in args.items():
        argv += ["--build-arg", f"{key}={value}"]
    bundle = ca_bundle()
    if bundle is not None:
        argv += ["--secret", f"id=ca-bundle,src={bundle}"]
    t0 = time.monotonic()
    say(f"building {name} from {containerfile}")
    run([*argv, str(ROOT)], out / f"{name}.build.log")
    archive = out / f"{name}.oci.tar"
    archive.unlink(missing_ok=True)
    run(["buildah", "push", "-q", tag, f"oci-archive:{archive}:{name}"])
    seconds = time.monotonic() - t0
    digest = manifest_digest(archive)
    say(f"{name}: {archive} {digest} ({archive.stat().st_size / 1e6:.0f} MB, {seconds:.0f} s)")
    return {"archive": archive.name, "digest": digest, "bytes": archive.stat().st_size,
            "seconds": round(seconds, 1)}


def manifest_digest(archive: Path) -> str:
    """The image's manifest digest (what a registry shows and a chart pins), checked against
    the manifest blob it names."""
    with tarfile.open(archive) as t:
        index = json.load(t.extractfile("index.json"))  # type: ignore[arg-type]
        digest: str = index["manifests"][0]["digest"]
        blob = t.extractfile("blobs/" + digest.replace(":", "/"))
        assert blob is not None
        if "sha256:" + hashlib.sha256(blob.read()).hexdigest() != digest:
            raise SystemExit(f"{archive}: the manifest blob does not match {digest}")
    return digest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "containerfile-images")
    opts = parser.parse_args(argv)
    why = why_not()
    if why is not None:
        print(f"cannot build the Containerfiles here: {why}", file=sys.stderr)
        return 2
    opts.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tessera-base-") as work:
        make_base(Path(work))
    images = {name: build(name, opts.out) for name in IMAGES}
    print(json.dumps({"dir": str(opts.out.resolve()), "images": images}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

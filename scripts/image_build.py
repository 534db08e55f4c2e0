"""Build tessera's two OCI images here, without a container runtime or a base image to pull.

    ./dev image [--out DIR] [--no-cache]          (or: .venv/bin/python scripts/image_build.py)

What it does (docs/install.md, "Building the images"):
  1. wheels: tessera's own (with libtessera-cuda.so, built by scripts/setup.d/10-native.sh)
     and every dependency, by pip for CPython 3.11 / manylinux x86_64;
  2. one root filesystem from Debian bookworm packages with mmdebstrap (variant essential +
     python3; no apt, no pip, no compiler, no docs but copyright files), a virtual environment
     /opt/tessera with the wheels installed offline, user nonroot (65532);
  3. two OCI images from that one layer with umoci, written as OCI archives:
       tessera       control plane: tessera-scheduler, tessera-webhook, the API + console;
                     user 65532
       tessera-node  node side: tessera-node + libtessera-cuda.so; user 0 (see the chart's
                     node-agent template for why)
  4. prints the digests; writes packages.txt (every Debian and Python package with its exact
     version) and sbom.cdx.json (CycloneDX 1.5) beside the archives.

The build is cached by a hash of its inputs (the tracked source, pyproject.toml, native/, this
script, the built isolation library): a second run with the same inputs costs one hash. The apt
archives mmdebstrap downloads are kept in ${TESSERA_CACHE:-~/.cache/tessera}/apt-archives.
Needs root (mmdebstrap in root mode, chroot), mmdebstrap and umoci (Debian packages; installed
by scripts/setup.d/40-image-tools.sh).
"""

from __future__ import annotations

import argparse
import fcntl
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
CACHE = Path(os.environ.get("TESSERA_CACHE", Path.home() / ".cache" / "tessera"))
SUITE = "bookworm"
MIRROR = os.environ.get("TESSERA_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SECURITY = os.environ.get("TESSERA_DEBIAN_SECURITY", "http://deb.debian.org/debian-security")
DEBIAN_PACKAGES = ["python3", "ca-certificates"]
BUILD_ONLY_PACKAGES = ["python3-venv", "python3.11-venv", "python3-pip-whl", "python3-setuptools-whl"]
REPOSITORY = "ghcr.io/tessera-gpu"
UID = 65532
# Files no image layer may hold: build leftovers and anything that looks like a secret.
DPKG_EXCLUDES = ["/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*",
                 "/usr/share/doc/*", "/usr/share/lintian/*", "/usr/share/linda/*"]
DPKG_INCLUDES = ["/usr/share/doc/*/copyright"]


def say(msg: str) -> None:
    print(f"[image] {msg}", file=sys.stderr, flush=True)


def version() -> str:
    for line in (ROOT / "pyproject.toml").read_text().splitlines():
        if line.startswith("version = "):
            return line.split('"')[1]
    raise SystemExit("pyproject.toml has no version")


def _library() -> Path:
    lib = ROOT / "src" / "tessera" / "isolation" / "lib" / "libtessera-cuda.so"
    if not lib.exists():
        raise SystemExit(f"{lib} is missing: run ./dev setup (scripts/setup.d/10-native.sh) first")
    return lib


def input_hash() -> str:
    """Hash of everything the images are made of (tracked files + the built library)."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--", "src", "native", "pyproject.toml", "README.md"],
        cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    h = hashlib.sha256(f"{SUITE} {DEBIAN_PACKAGES} {version()}".encode())
    for name in sorted(f.decode() for f in files if f):
        if name.startswith("src/tessera/testing/"):
            continue  # not in the images
        path = ROOT / name
        if path.is_file():
            h.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    h.update(hashlib.sha256(_library().read_bytes()).digest())
    h.update(hashlib.sha256(Path(__file__).read_bytes()).digest())  # how they are made
    return h.hexdigest()[:20]


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if out.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out  # type: ignore[no-any-return]


def build_wheels(dest: Path) -> None:
    say("wheels: tessera and its dependencies (pip, cp311 manylinux x86_64)")
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(dest), str(ROOT)])
    # Only binary wheels for the target: the image has no compiler.
    for w in dest.iterdir():
        if not w.name.endswith(".whl"):
            raise SystemExit(f"not a wheel: {w}")


def build_rootfs(wheels: Path, layer_tar: Path) -> None:
    """mmdebstrap writes the root filesystem straight into an uncompressed tar (one layer)."""
    archives = CACHE / "apt-archives"
    archives.mkdir(parents=True, exist_ok=True)
    (archives / "partial").mkdir(exist_ok=True)
    purge = " ".join(BUILD_ONLY_PACKAGES)
    hooks = [
        # keep downloaded .debs between builds (a cached apt download dir, also for CI)
        "--setup-hook=mkdir -p \"$1\"/var/cache/apt/archives/",
        f"--setup-hook=sync-in {archives} /var/cache/apt/archives/",
        f"--customize-hook=sync-out /var/cache/apt/archives {archives}",
        # the application: a venv from the wheels, offline; then pip, setuptools and the
        # wheels go (no installer, no build tool in the image)
        f"--customize-hook=copy-in {wheels} /tmp",
        "--customize-hook=chroot \"$1\" python3 -m venv /opt/tessera",
        "--customize-hook=chroot \"$1\" /opt/tessera/bin/pip install --quiet --no-index "
        "--no-compile --find-links /tmp/wheels tessera",
        "--customize-hook=chroot \"$1\" /opt/tessera/bin/python -m pip uninstall --quiet -y "
        "pip setuptools",
        # the test harness is no part of the product (nothing in it imports tessera.testing)
        "--customize-hook=rm -rf \"$1\"/opt/tessera/lib/python3.11/site-packages/tessera/testing",
        # byte-code for the venv (the root is read-only at run time; Debian's own packages
        # compiled theirs when installed)
        "--customize-hook=chroot \"$1\" /opt/tessera/bin/python -m compileall -q -j 0 "
        "--invalidation-mode unchecked-hash /opt/tessera/lib",
        f"--customize-hook=chroot \"$1\" dpkg --purge {purge}",
        "--customize-hook=rm -rf \"$1\"/tmp/wheels \"$1\"/root/.cache \"$1\"/var/cache/apt/archives/*.deb "
        "\"$1\"/var/lib/apt/lists/* \"$1\"/var/log/* \"$1\"/etc/machine-id "
        "\"$1\"/var/cache/ldconfig/aux-cache",
        # libtessera-cuda.so where the node agent and people expect it
        "--customize-hook=mkdir -p \"$1\"/usr/local/lib/tessera && ln -s "
        "/opt/tessera/lib/python3.11/site-packages/tessera/isolation/lib/libtessera-cuda.so "
        "\"$1\"/usr/local/lib/tessera/libtessera-cuda.so",
        # the non-root user of the control plane
        f"--customize-hook=echo 'nonroot:x:{UID}:{UID}:nonroot:/home/nonroot:/usr/sbin/nologin'"
        " >> \"$1\"/etc/passwd",
        f"--customize-hook=echo 'nonroot:x:{UID}:' >> \"$1\"/etc/group",
        f"--customize-hook=mkdir -p \"$1\"/home/nonroot && chown {UID}:{UID} \"$1\"/home/nonroot",
        # the package list, read by package_list() and removed from the layer afterwards
        "--customize-hook=chroot \"$1\" dpkg-query -W -f '${Package}=${Version}\\n' "
        "> \"$1\"/.tessera-dpkg.txt",
        "--customize-hook=chroot \"$1\" /opt/tessera/bin/python -c 'import importlib.metadata "
        "as m; [print(d.metadata[\"Name\"] + \"==\" + d.version) for d in m.distributions()]' "
        "> \"$1\"/.tessera-python.txt",
    ]
    opts = [f"--dpkgopt=path-exclude={p}" for p in DPKG_EXCLUDES]
    opts += [f"--dpkgopt=path-include={p}" for p in DPKG_INCLUDES]
    include = ",".join(DEBIAN_PACKAGES + BUILD_ONLY_PACKAGES)
    say(f"root filesystem: mmdebstrap {SUITE} ({include}), about a minute")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    env["SOURCE_DATE_EPOCH"] = str(_epoch())
    run(["mmdebstrap", "--quiet", "--mode=root", "--variant=essential", "--format=tar",
         f"--include={include}", *opts, *hooks, SUITE, str(layer_tar),
         f"deb {MIRROR} {SUITE} main", f"deb {MIRROR} {SUITE}-updates main",
         f"deb {SECURITY} {SUITE}-security main"], env=env)


def _epoch() -> int:
    out = subprocess.run(["git", "log", "-1", "--format=%ct"], cwd=ROOT, capture_output=True,
                         text=True)
    return int(out.stdout.strip() or "0")


APT_LEFTOVERS = ("var/cache/apt", "var/lib/apt")


def split_package_lists(layer_tar: Path, dest: Path) -> tuple[list[str], list[str]]:
    """Take the two package lists out of the layer (they are build records, not image
    content), and apt's state directories (the image has no apt)."""
    lists: dict[str, str] = {}
    tmp = layer_tar.with_suffix(".clean.tar")
    with tarfile.open(layer_tar) as src, tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as out:
        for member in src:
            name = member.name.removeprefix("./")
            if name.startswith(APT_LEFTOVERS):
                continue  # apt's locks and partial dirs: the image has no apt
            if name.startswith("dev/") and name != "dev/":
                continue  # device nodes: a container runtime provides /dev
            if name in (".tessera-dpkg.txt", ".tessera-python.txt"):
                f = src.extractfile(member)
                lists[name] = f.read().decode() if f else ""
                continue
            out.addfile(member, src.extractfile(member) if member.isfile() else None)
    tmp.replace(layer_tar)
    deb = sorted(lines for lines in lists.get(".tessera-dpkg.txt", "").splitlines() if lines)
    py = sorted((x for x in lists.get(".tessera-python.txt", "").splitlines() if x),
                key=str.lower)
    (dest / "packages.txt").write_text(
        "# Debian packages (dpkg), exact versions\n" + "\n".join(deb)
        + "\n# Python packages in /opt/tessera, exact versions\n" + "\n".join(py) + "\n")
    return deb, py


def sbom(deb: list[str], py: list[str], digests: dict[str, str]) -> dict[str, object]:
    comps: list[dict[str, str]] = []
    for line in deb:
        name, _, ver = line.partition("=")
        comps.append({"type": "library", "name": name, "version": ver,
                      "purl": f"pkg:deb/debian/{name}@{ver}?distro=debian-12"})
    for line in py:
        name, _, ver = line.partition("==")
        comps.append({"type": "library", "name": name, "version": ver,
                      "purl": f"pkg:pypi/{name.lower()}@{ver}"})
    return {"bomFormat": "CycloneDX", "specVersion": "1.5", "version": 1,
            "metadata": {"component": {"type": "container", "name": "tessera",
                                       "version": version(),
                                       "properties": [{"name": f"digest:{k}", "value": v}
                                                      for k, v in digests.items()]}},
            "components": comps}


IMAGES = {
    "tessera": {"user": f"{UID}:{UID}", "entrypoint": [],
                "cmd": ["tessera-scheduler", "--help"]},
    "tessera-node": {"user": "0:0", "entrypoint": [], "cmd": ["tessera-node", "--help"]},
}
ENV = ["PATH=/opt/tessera/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
       "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1", "LANG=C.UTF-8"]


def write_image(name: str, layer_tar: Path, out: Path, created: str) -> str:
    """One OCI layout with the layer and this image's config, tarred as an OCI archive."""
    spec = IMAGES[name]
    tag = version()
    with tempfile.TemporaryDirectory(prefix=f"tessera-oci-{name}-") as tmp:
        layout = Path(tmp) / "layout"
        run(["umoci", "init", "--layout", str(layout)])
        run(["umoci", "new", "--image", f"{layout}:{tag}"])
        run(["umoci", "raw", "add-layer", "--image", f"{layout}:{tag}", "--no-history",
             str(layer_tar)])
        cfg = ["umoci", "config", "--image", f"{layout}:{tag}", "--no-history",
               "--created", created, "--author", "tessera", "--os", "linux",
               "--architecture", "amd64", f"--config.user={spec['user']}",
               "--config.workingdir=/", "--clear=config.env", "--clear=config.cmd"]
        cfg += [f"--config.env={e}" for e in ENV]
        cfg += [f"--config.cmd={c}" for c in spec["cmd"]]
        cfg += [f"--config.label=org.opencontainers.image.title={name}",
                f"--config.label=org.opencontainers.image.version={tag}",
                "--config.label=org.opencontainers.image.source=https://github.com/tessera-gpu/tessera",
                f"--manifest.annotation=org.opencontainers.image.ref.name={tag}"]
        run(cfg)
        run(["umoci", "gc", "--layout", str(layout)])
        index = json.loads((layout / "index.json").read_text())
        digest: str = index["manifests"][0]["digest"]
        archive = out / f"{name}.oci.tar"
        with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as t:
            for path in sorted(layout.rglob("*")):
                info = t.gettarinfo(str(path), str(path.relative_to(layout)))
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                if path.is_file():
                    with path.open("rb") as f:
                        t.addfile(info, f)
                else:
                    t.addfile(info)
    return digest


def compressed_size(archive: Path) -> int:
    """Bytes of the archive's blobs (layers are gzip-compressed): what a registry stores."""
    with tarfile.open(archive) as t:
        return sum(m.size for m in t if m.name.startswith("blobs/"))


def build(out: Path, use_cache: bool = True) -> dict[str, object]:
    """Build (or take from the cache) and copy into ``out``. Builds on one machine take turns
    (a lock file beside the cache): two at once used to share one temporary directory, and one
    deleted it under the other; the second now finds the first's build in the cache."""
    (CACHE / "images").mkdir(parents=True, exist_ok=True)
    with open(CACHE / "images.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(out, use_cache)


def _build_locked(out: Path, use_cache: bool) -> dict[str, object]:
    key = input_hash()
    cached = CACHE / "images" / key
    if use_cache and (cached / "images.json").exists():
        say(f"cached: inputs {key} unchanged ({cached})")
        result: dict[str, object] = json.loads((cached / "images.json").read_text())
    else:
        t0 = time.monotonic()
        for tool in ("mmdebstrap", "umoci"):
            if shutil.which(tool) is None:
                raise SystemExit(f"{tool} is missing: apt-get install mmdebstrap umoci "
                                 "(scripts/setup.d/40-image-tools.sh)")
        if os.geteuid() != 0:
            raise SystemExit("building the root filesystem needs root (mmdebstrap --mode=root)")
        tmp_root = cached.with_name(cached.name + ".tmp")
        shutil.rmtree(tmp_root, ignore_errors=True)
        tmp_root.mkdir(parents=True)
        with tempfile.TemporaryDirectory(prefix="tessera-image-") as tmp:
            wheels = Path(tmp) / "wheels"
            wheels.mkdir()
            build_wheels(wheels)
            layer = Path(tmp) / "rootfs.tar"
            build_rootfs(wheels, layer)
            deb, py = split_package_lists(layer, tmp_root)
            created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(_epoch()))
            digests = {name: write_image(name, layer, tmp_root, created) for name in IMAGES}
        images = {}
        for name, digest in digests.items():
            archive = tmp_root / f"{name}.oci.tar"
            images[name] = {"archive": archive.name, "digest": digest,
                            "reference": f"{REPOSITORY}/{name}:{version()}",
                            "compressed_bytes": compressed_size(archive)}
        (tmp_root / "sbom.cdx.json").write_text(json.dumps(sbom(deb, py, digests), indent=1))
        result = {"inputs": key, "version": version(), "images": images,
                  "build_seconds": round(time.monotonic() - t0, 1)}
        (tmp_root / "images.json").write_text(json.dumps(result, indent=1))
        shutil.rmtree(cached, ignore_errors=True)
        tmp_root.rename(cached)
        for old in (CACHE / "images").iterdir():  # one build kept: archives are large
            if old != cached:
                shutil.rmtree(old, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    for f in cached.iterdir():
        if f.resolve() != (out / f.name).resolve():
            shutil.copyfile(f, out / f.name)
    result = {**result, "dir": str(out)}
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="./dev image", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(ROOT / "build" / "images"),
                   help="where the OCI archives, packages.txt and the SBOM go")
    p.add_argument("--no-cache", action="store_true", help="rebuild even if the inputs match")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = p.parse_args(argv)
    result = build(Path(args.out), use_cache=not args.no_cache)
    if args.json:
        print(json.dumps(result))
        return 0
    images = result["images"]
    assert isinstance(images, dict)
    for img in images.values():
        mb = img["compressed_bytes"] / 1e6
        print(f"{img['reference']}  {img['digest']}  {mb:.1f} MB compressed  "
              f"{Path(str(result['dir'])) / img['archive']}")
    print(f"package list: {Path(str(result['dir'])) / 'packages.txt'}; "
          f"SBOM: {Path(str(result['dir'])) / 'sbom.cdx.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

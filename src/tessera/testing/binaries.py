"""Build the test cluster's binaries with the machine's Go, from the Go module proxy only.

Every binary is pinned to one version and cached as ``<cache>/bin/<name>-<version>``, where
``<cache>`` is ``$TESSERA_CACHE`` or ``~/.cache/tessera``. A cached binary is never rebuilt, so
``ensure()`` is quick once everything is there.

``go install pkg@version`` refuses modules whose go.mod has local ``replace`` directives, which is
the case for ``k8s.io/kubernetes`` (its staging modules) and for etcd's server module. For those we
generate a throw-away main module under ``<cache>/build/`` that requires the release and replaces
each locally-replaced module with its published version (``k8s.io/api v0.Y.Z`` for Kubernetes
``v1.Y.Z``), then ``go build`` the command from it. The list of replaced modules is read from the
release's own go.mod, so it follows the release when the pin moves.

Run ``python -m tessera.testing.binaries ensure`` to build what is missing and print the paths.
(Each pinned binary's build recipe, the cache and its lock; building Go itself is
``tessera.testing.go_build``.)
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tessera.testing import go_build

# Kept under these names here: the recipes below and other harness modules use them.
(LDFLAGS_STRIP, BuildError, cache_dir, local_replaces, go_directive, throwaway_go_mod,
 kubernetes_staging_version, kubernetes_module_dir, _go, _go_env, _run, _download_go_mod,
 _write_module, _kubernetes_ldflags) = (
    go_build.LDFLAGS_STRIP, go_build.BuildError, go_build.cache_dir, go_build.local_replaces,
    go_build.go_directive, go_build.throwaway_go_mod, go_build.kubernetes_staging_version,
    go_build.kubernetes_module_dir, go_build._go, go_build._go_env, go_build._run,
    go_build._download_go_mod, go_build._write_module, go_build._kubernetes_ldflags)

KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v3.22.0"
DEX_VERSION = "v0.0.0-20260806151424-ab64ed778070"
DEX_API_VERSION = "v2.4.1-0.20260806151424-ab64ed778070"
"""Dex (the OIDC provider of the single sign-on tests): its newest commit on the module proxy
(its tags are v2.x "+incompatible" from before modules). Its go.mod replaces its own api/v2
module with the directory beside it, so it is built from a throw-away module with api/v2
pinned to the same commit (the published v2.4.0 lacks what this commit uses)."""
JOBSET_VERSION = "v0.10.1"
LWS_VERSION = "v0.7.0"
KUBERAY_VERSION = "v1.5.0"
TRAINER_VERSION = "v2.1.0"  # Kubeflow Trainer (TrainJob v2), only for the trainjob tests


def bin_dir() -> Path:
    return cache_dir() / "bin"


@dataclass(frozen=True)
class Binary:
    name: str
    version: str
    build: Callable[[Binary, Path], None]
    """Writes the executable to the given path (a temporary name, renamed once complete)."""

    @property
    def path(self) -> Path:
        return bin_dir() / f"{self.name}-{self.version}"

    @property
    def log_path(self) -> Path:
        return cache_dir() / "logs" / f"build-{self.name}-{self.version}.log"


def _build_kubernetes_command(command: str) -> Callable[[Binary, Path], None]:
    def build(binary: Binary, out: Path) -> None:
        workdir = kubernetes_module_dir(binary.version)
        ldflags = _kubernetes_ldflags(
            binary.version, ["k8s.io/component-base/version", "k8s.io/client-go/pkg/version"]
        )
        _run(
            [_go(), "build", f"-ldflags={ldflags}", "-o", str(out),
             f"k8s.io/kubernetes/cmd/{command}"],
            cwd=workdir,
            log=binary.log_path,
            env=_go_env(module_mode=True),
        )

    return build


def _build_etcd(binary: Binary, out: Path) -> None:
    module = "go.etcd.io/etcd/server/v3"
    go_mod = _download_go_mod(module, binary.version, log=binary.log_path)
    siblings = {
        mod: binary.version
        for mod, target in local_replaces(go_mod).items()
        if mod.startswith("go.etcd.io/etcd/") and "FORBIDDEN" not in target
    }
    text = throwaway_go_mod(
        require=module, version=binary.version, go_version=go_directive(go_mod), replaces=siblings
    )
    workdir = _write_module(cache_dir() / "build" / f"etcd-{binary.version}", text)
    _run(
        [_go(), "build", f"-ldflags={LDFLAGS_STRIP}", "-o", str(out), module],
        cwd=workdir,
        log=binary.log_path,
        env=_go_env(module_mode=True),
    )


def _build_dex(binary: Binary, out: Path) -> None:
    module = "github.com/dexidp/dex"
    go_mod = _download_go_mod(module, binary.version, log=binary.log_path)
    replaces = {mod: DEX_API_VERSION for mod in local_replaces(go_mod)
                if mod == "github.com/dexidp/dex/api/v2"}
    text = throwaway_go_mod(require=module, version=binary.version,
                            go_version=go_directive(go_mod), replaces=replaces)
    workdir = _write_module(cache_dir() / "build" / f"dex-{binary.version}", text)
    _run([_go(), "build", f"-ldflags={LDFLAGS_STRIP}", "-o", str(out), f"{module}/cmd/dex"],
         cwd=workdir, log=binary.log_path, env=_go_env(module_mode=True))


def _build_listless(module: str, package: str) -> Callable[[Binary, Path], None]:
    """``go build`` of ``package`` from a throw-away module requiring ``module@version``: for
    modules whose version list the proxy refuses (403), which ``go install pkg@version`` reads
    for its deprecation check (sigs.k8s.io/jobset, sigs.k8s.io/lws)."""
    def build(binary: Binary, out: Path) -> None:
        go_mod = _download_go_mod(module, binary.version, log=binary.log_path)
        text = throwaway_go_mod(require=module, version=binary.version,
                                go_version=go_directive(go_mod), replaces={})
        workdir = _write_module(cache_dir() / "build" / f"{binary.name}-{binary.version}", text)
        _run([_go(), "build", f"-ldflags={LDFLAGS_STRIP}", "-o", str(out), package],
             cwd=workdir, log=binary.log_path, env=_go_env(module_mode=True))

    return build


def _go_install(package: str) -> Callable[[Binary, Path], None]:
    def build(binary: Binary, out: Path) -> None:
        gobin = out.parent / f".gobin-{binary.name}"
        shutil.rmtree(gobin, ignore_errors=True)
        env = _go_env(module_mode=False)
        env["GOBIN"] = str(gobin)
        _run(
            [_go(), "install", f"-ldflags={LDFLAGS_STRIP}", f"{package}@{binary.version}"],
            cwd=cache_dir(),
            log=binary.log_path,
            env=env,
        )
        built = gobin / package.rstrip("/").split("/")[-1]
        os.replace(built, out)
        shutil.rmtree(gobin, ignore_errors=True)

    return build


TRAINER = "github.com/kubeflow/trainer/v2"
BINARIES: dict[str, Binary] = {
    b.name: b
    for b in [
        Binary("etcd", ETCD_VERSION, _build_etcd),
        Binary("kube-apiserver", KUBERNETES_VERSION, _build_kubernetes_command("kube-apiserver")),
        Binary("kubectl", KUBERNETES_VERSION, _build_kubernetes_command("kubectl")),
        # Only for the differential check of tessera's predicates against kube-scheduler's.
        Binary("kube-scheduler", KUBERNETES_VERSION, _build_kubernetes_command("kube-scheduler")),
        # Only for tests that need Kubernetes' own controllers (Jobs, ReplicaSets, garbage
        # collection, ResourceClaims from templates): tessera.testing.controller_manager.
        Binary("kube-controller-manager", KUBERNETES_VERSION,
               _build_kubernetes_command("kube-controller-manager")),
        Binary("kwok", KWOK_VERSION, _go_install("sigs.k8s.io/kwok/cmd/kwok")),
        # The engines' controllers, only for their tests (tessera.testing.engines).
        Binary("jobset", JOBSET_VERSION, _build_listless("sigs.k8s.io/jobset",
                                                         "sigs.k8s.io/jobset")),
        Binary("lws", LWS_VERSION, _build_listless("sigs.k8s.io/lws", "sigs.k8s.io/lws/cmd")),
        Binary("kuberay", KUBERAY_VERSION,
               _go_install("github.com/ray-project/kuberay/ray-operator")),
        Binary("trainer", TRAINER_VERSION, _build_listless(TRAINER, f"{TRAINER}/cmd/trainer-"
                                                           "controller-manager")),
        Binary("helm", HELM_VERSION, _go_install("helm.sh/helm/v3/cmd/helm")),
        # Only for the single sign-on tests (a real OIDC provider).
        Binary("dex", DEX_VERSION, _build_dex),
    ]
}
CLUSTER_BINARIES = ("etcd", "kube-apiserver", "kubectl", "kwok")


KWOK_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)


def kwok_stages_file() -> Path:
    """kwok's own "fast" Stage definitions (nodes Ready with lease heartbeats, bound pods Running,
    deleted pods removed), gathered once from the kwok release in the module cache.

    The standalone ``kwok`` binary has no stages built in: kwokctl passes these same files."""
    path = bin_dir() / f"kwok-{KWOK_VERSION}-stages.yaml"
    if path.is_file():
        return path
    log = cache_dir() / "logs" / f"build-kwok-{KWOK_VERSION}.log"
    out = _run(
        [_go(), "mod", "download", "-json", f"sigs.k8s.io/kwok@{KWOK_VERSION}"],
        cwd=cache_dir(),
        log=log,
        env=_go_env(module_mode=False),
    )
    source = Path(json.loads(out)["Dir"])
    docs = [(source / rel).read_text().strip() for rel in KWOK_STAGES]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n---\n".join(docs) + "\n")
    os.replace(tmp, path)
    return path


# Rough cold build times on a 2-core machine (module downloads included); the estimate shown is
# the last recorded build time of that binary on this machine when there is one.
TYPICAL_SECONDS = {"etcd": 120, "kube-apiserver": 300, "kubectl": 60, "kwok": 120, "helm": 120,
                   "kube-scheduler": 240, "dex": 300, "kube-controller-manager": 300,
                   "jobset": 240, "lws": 240, "kuberay": 240, "trainer": 300}


def _holder_path() -> Path:
    return cache_dir() / "build.lock.holder"


def lock_holder() -> str:
    """Who holds the build lock, in words (from the file the holder writes beside the lock)."""
    try:
        info = json.loads(_holder_path().read_text())
    except (OSError, ValueError):
        return "another process (it did not say which)"
    since = time.strftime("%H:%M:%S", time.localtime(float(info.get("since", 0))))
    doing = f", building {info['building']}" if info.get("building") else ""
    return f"pid {info.get('pid')} ({info.get('command', '?')}; since {since}{doing})"


def _write_holder(building: str | None) -> None:
    info = {"pid": os.getpid(), "command": " ".join(sys.argv)[:200], "since": _HOLDER_SINCE[0],
            "building": building}
    tmp = _holder_path().with_name(f"build.lock.holder.{os.getpid()}")
    tmp.write_text(json.dumps(info))
    os.replace(tmp, _holder_path())


_HOLDER_SINCE = [0.0]


@contextlib.contextmanager
def _build_lock(report: Callable[[str], None] | None = None,
                poll: float = 1.0, remind: float = 60.0) -> Iterator[None]:
    """One build at a time per cache (a setup hook and a test may race). A wait says who holds
    the lock, and again every ``remind`` seconds."""
    lock = cache_dir() / "build.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as fh:
        waited = 0.0
        next_note = 0.0
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if report and waited >= next_note:
                    report(f"waiting for the build lock {lock} held by {lock_holder()}"
                           + (f" (waited {waited:.0f} s)" if waited else ""))
                    next_note = waited + remind
                time.sleep(poll)
                waited += poll
        try:
            _HOLDER_SINCE[0] = time.time()
            _write_holder(None)
            yield
        finally:
            _holder_path().unlink(missing_ok=True)
            fcntl.flock(fh, fcntl.LOCK_UN)


def estimate_seconds(name: str) -> float:
    """The last recorded build time of ``name`` on this machine, else a typical cold time."""
    path = cache_dir() / "logs" / "build-times.jsonl"
    found: float | None = None
    try:
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                entry = json.loads(line)
                if entry["name"] == name:
                    found = float(entry["seconds"])
    except OSError:
        pass
    return found if found is not None else float(TYPICAL_SECONDS.get(name, 120))


def _human(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def _is_built(binary: Binary) -> bool:
    return binary.path.is_file() and os.access(binary.path, os.X_OK)


def ensure(
    names: list[str] | tuple[str, ...] | None = None,
    *,
    report: Callable[[str], None] | None = None,
) -> dict[str, Path]:
    """Build whichever of ``names`` (default: all) is not cached yet; return their paths.
    Each build (and a wait on another process's build) is announced through ``report``
    (default: a line on stderr)."""
    if report is None:
        report = _to_stderr
    wanted = list(names) if names else list(BINARIES)
    unknown = [n for n in wanted if n not in BINARIES]
    if unknown:
        raise BuildError(f"unknown binary {unknown[0]!r}; known: {', '.join(BINARIES)}")
    binaries = [BINARIES[n] for n in wanted]
    missing = [b for b in binaries if not _is_built(b)]
    if missing:
        with _build_lock(report):
            _build_missing(missing, report)
    if "kwok" in wanted:
        kwok_stages_file()
    return {b.name: b.path for b in binaries}


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _build_missing(binaries: list[Binary], report: Callable[[str], None] | None) -> None:
    queue = [b for b in binaries if not _is_built(b)]  # another process may have built some
    if report and queue:
        total = sum(estimate_seconds(b.name) for b in queue)
        report(f"building {len(queue)} Go binar{'y' if len(queue) == 1 else 'ies'} for the test "
               f"cluster ({', '.join(b.name for b in queue)}): about {_human(total)} in all; "
               f"cached afterwards in {bin_dir()}")
    for position, binary in enumerate(queue, 1):
        if report:
            report(f"[{position}/{len(queue)}] building {binary.name} {binary.version} "
                   f"(about {_human(estimate_seconds(binary.name))}; log: {binary.log_path})")
        _write_holder(f"{binary.name} {binary.version} [{position}/{len(queue)}]")
        binary.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = binary.path.with_name(binary.path.name + ".tmp")
        tmp.unlink(missing_ok=True)
        start = time.monotonic()
        binary.build(binary, tmp)
        tmp.chmod(0o755)
        os.replace(tmp, binary.path)
        seconds = time.monotonic() - start
        _record_build_time(binary, seconds)
        if report:
            report(f"[{position}/{len(queue)}] built {binary.name} {binary.version} in "
                   f"{seconds:.0f} s")


def _record_build_time(binary: Binary, seconds: float) -> None:
    path = cache_dir() / "logs" / "build-times.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {
        "name": binary.name,
        "version": binary.version,
        "seconds": round(seconds, 1),
        "cpus": os.cpu_count(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with path.open("a") as fh:
        fh.write(json.dumps(entry) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.testing.binaries", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_ensure = sub.add_parser("ensure", help="build what is missing and print 'name path' lines")
    p_ensure.add_argument("names", nargs="*", help=f"default: all of {', '.join(BINARIES)}")
    sub.add_parser("versions", help="print the pinned versions")
    args = parser.parse_args(argv)
    if args.cmd == "versions":
        for b in BINARIES.values():
            print(f"{b.name} {b.version}")
        return 0
    try:
        paths = ensure(args.names, report=lambda msg: print(msg, file=sys.stderr, flush=True))
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, path in paths.items():
        print(f"{name} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Build native/ (the library, the fake driver, the test programs) with the machine's gcc.

Outputs are cached outside the repository under ``${TESSERA_CACHE:-~/.cache/tessera}/native/<key>``
where the key hashes every source file and the compiler version, so an unchanged tree is a
no-op and two checkouts never mix their builds. ``--install`` copies the library into the
package (``tessera/isolation/lib/``) when it differs. Used by scripts/setup.d/10-native.sh,
the tests and the benchmark.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tessera.isolation.library import LIBRARY_NAME, PACKAGE_LIB_DIR

REPO_ROOT = Path(__file__).resolve().parents[3]
NATIVE_DIR = REPO_ROOT / "native"


class NativeBuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class NativeBuild:
    root: Path

    @property
    def library(self) -> Path:
        return self.root / LIBRARY_NAME

    @property
    def fake_dir(self) -> Path:
        """Directory holding the fake libcuda.so.1 and libnvidia-ml.so.1 (for LD_LIBRARY_PATH)."""
        return self.root / "fake"

    def program(self, name: str) -> Path:
        return self.root / "tests" / name


def cache_root() -> Path:
    base = os.environ.get("TESSERA_CACHE") or str(Path.home() / ".cache" / "tessera")
    return Path(base) / "native"


def _compiler() -> str:
    return os.environ.get("CC", "gcc")


def source_key(native_dir: Path = NATIVE_DIR) -> str:
    if not (native_dir / "Makefile").is_file():
        raise NativeBuildError(f"native sources not found at {native_dir} (a source checkout is needed)")
    digest = hashlib.sha256()
    for path in sorted(native_dir.rglob("*")):
        rel = path.relative_to(native_dir)
        if not path.is_file() or rel.parts[0] == "build":
            continue
        digest.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")
    try:
        version = subprocess.run([_compiler(), "-dumpfullversion", "-dumpversion"], check=True,
                                 capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise NativeBuildError(f"no C compiler ({_compiler()}): {exc}") from exc
    digest.update(f"{_compiler()} {version} {os.uname().machine}".encode())
    return digest.hexdigest()[:16]


def ensure_built(native_dir: Path = NATIVE_DIR, *, quiet: bool = True,
                 lib_only: bool = False) -> NativeBuild:
    """Builds everything under native/ unless the cache already holds this exact tree's build.
    ``lib_only``: only the isolation library (what the product needs; the fake driver and the
    test programs are for tests), cached apart unless the whole build is there already."""
    key = source_key(native_dir)
    root = cache_root()
    if lib_only and (root / key / ".complete").is_file():
        return ensure_built(native_dir, quiet=quiet)
    final = root / (f"{key}-lib" if lib_only else key)
    if (final / ".complete").is_file():
        with contextlib.suppress(OSError):
            os.utime(final)  # in use: keeps it from being pruned
        return NativeBuild(final)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / ".complete").is_file():
            return NativeBuild(final)
        work = root / f"{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        jobs = str(min(2, os.cpu_count() or 1))
        result = subprocess.run(
            ["make", "-C", str(native_dir), f"-j{jobs}", f"BUILD={work}", f"CC={_compiler()}",
             "lib" if lib_only else "all"],
            capture_output=True, text=True,
        )
        if result.returncode != 0:
            shutil.rmtree(work, ignore_errors=True)
            raise NativeBuildError(f"make -C {native_dir} failed:\n{result.stdout}\n{result.stderr}")
        if not quiet:
            print(result.stdout, end="")
        (work / ".complete").write_text(final.name + "\n")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(work, final)
        _prune(root, keep=key)
    return NativeBuild(final)


def _prune(root: Path, keep: str, max_age_s: float = 7 * 86400) -> None:
    """Drops builds of other source versions unused for a week (another checkout may still be
    using a recent one, so those stay)."""
    now = time.time()
    for old in root.iterdir():
        if not old.is_dir() or old.name.split("-")[0] == keep:
            continue
        try:
            if now - old.stat().st_mtime > max_age_s:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass


def install_library(build: NativeBuild, lib_dir: Path = PACKAGE_LIB_DIR) -> Path:
    """Copies the library into the package if it differs; replaced atomically (new inode), so
    processes that have the old one mapped keep running."""
    lib_dir.mkdir(parents=True, exist_ok=True)
    target = lib_dir / LIBRARY_NAME
    new = build.library.read_bytes()
    if target.is_file() and target.read_bytes() == new:
        return target
    tmp = lib_dir / f".{LIBRARY_NAME}.{os.getpid()}.tmp"
    tmp.write_bytes(new)
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.isolation.build")
    parser.add_argument("--install", action="store_true", help="copy the library into the package")
    parser.add_argument("--print-dir", action="store_true", help="print the build directory")
    parser.add_argument("--lib-only", action="store_true",
                        help="only the isolation library (./dev run), not the fake driver and the "
                             "test programs")
    args = parser.parse_args(argv)
    try:
        build = ensure_built(quiet=True, lib_only=args.lib_only)
    except NativeBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.install:
        install_library(build)
    if args.print_dir:
        print(build.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())

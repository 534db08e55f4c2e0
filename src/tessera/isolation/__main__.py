"""Command line of the isolation library.

    python -m tessera.isolation --path
        print where libtessera-cuda.so is (exit 1 with a message if it is not built)
    python -m tessera.isolation --limit 8G [--device-limit 1=4Gi] [--region FILE | --per-process]
                                -- CMD [ARGS...]
        run CMD under the library with those limits (the environment-only form). Every process
        CMD starts shares one budget: a region file is created for the run (group-shareable,
        mode 0660, in a 0750 directory under $XDG_RUNTIME_DIR or the temporary directory) and
        removed when CMD ends; --region FILE uses that file instead (to share the budget with
        processes started elsewhere); --per-process gives each process its own full limit.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from tessera.core.errors import InvalidRequest
from tessera.isolation.config import REGION_ENV, manual_environment
from tessera.isolation.library import LibraryNotBuilt, library_path


def _device_limit(text: str) -> tuple[int | str, str]:
    key, sep, quantity = text.partition("=")
    key = key.strip()
    if key.startswith(("GPU-", "MIG-")) and sep and quantity.strip():
        return key, quantity.strip()
    if not sep or not (key.isascii() and key.isdigit()) or not quantity.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected INDEX=QUANTITY or UUID=QUANTITY, such as 1=4Gi")
    return int(key), quantity.strip()


def _nvml_uuids() -> list[str]:
    """Every GPU's UUID in NVML's index order. pynvml directly: the launcher sits below the node
    agent in the layers, so it does not borrow tessera.node's NVML session."""
    import pynvml

    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        out = []
        for i in range(count):
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            out.append(uuid.decode() if isinstance(uuid, bytes) else str(uuid))
        return out
    finally:
        pynvml.nvmlShutdown()


def _visible_uuids(environ: dict[str, str] | os._Environ[str]) -> list[str]:
    """UUIDs of the GPUs CUDA numbers 0, 1, ... here (NVML's order under CUDA_VISIBLE_DEVICES)."""
    uuids = _nvml_uuids()
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return uuids
    out: list[str] = []
    for tok in (t.strip() for t in visible.split(",")):
        if tok.isdigit() and int(tok) < len(uuids):
            out.append(uuids[int(tok)])
        elif tok.startswith(("GPU-", "MIG-")):
            match = [u for u in uuids if u.startswith(tok)]
            if len(match) != 1:
                break
            out.append(match[0])
        else:
            break  # the driver stops at the first entry it cannot use
    return out


def _limits_by_uuid(per_device: list[tuple[int | str, str]],
                    environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """--device-limit keyed by the GPU's UUID (resolved here, from this process's view), so a
    reordered CUDA_VISIBLE_DEVICES in the program never moves a limit to another GPU."""
    if not per_device:
        return {}
    uuids: list[str] | None = None
    out: dict[str, str] = {}
    for key, quantity in per_device:
        if isinstance(key, int):
            if uuids is None:
                try:
                    uuids = _visible_uuids(environ)
                except Exception as exc:  # NVML missing or failing: never key by index silently
                    raise InvalidRequest("--device-limit", f"cannot find the UUID of visible GPU {key} "
                                         f"to key its limit by ({exc})", key) from exc
            if key >= len(uuids):
                raise InvalidRequest("--device-limit", f"there is no visible GPU {key} "
                                     f"({len(uuids)} visible)", key)
            key = uuids[key]
        if key in out:
            raise InvalidRequest("--device-limit", "names one GPU twice", key)
        out[key] = quantity
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tessera.isolation",
        description="GPU memory isolation library (libtessera-cuda.so)",
    )
    parser.add_argument("--path", action="store_true", help="print the library's absolute path")
    parser.add_argument("--limit", help="limit for every visible GPU (8G, 8Gi, bytes)")
    parser.add_argument("--device-limit", type=_device_limit, action="append", default=[],
                        metavar="INDEX=QUANTITY", help="limit for one visible GPU; repeatable")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--region", type=Path,
                       help="shared region file, to share the limit with processes started elsewhere")
    where.add_argument("--per-process", action="store_true",
                       help="give each process its own full limit (default: one budget for all)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...] to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        if args.path:
            print(library_path())
            return 0
        if not command:
            parser.print_help()
            return 2
        by_uuid = _limits_by_uuid(args.device_limit, os.environ)
        env = manual_environment(args.limit, by_uuid,
                                 region_path=args.region.resolve() if args.region else None,
                                 base=os.environ)
    except LibraryNotBuilt as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except InvalidRequest as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    region_dir: Path | None = None
    if args.region is None and not args.per_process:
        region_dir, region = _run_region()
        env[REGION_ENV] = str(region)
    if region_dir is None:
        try:
            os.execvpe(command[0], command, {**os.environ, **env})
        except OSError as exc:
            print(f"error: cannot run {command[0]}: {exc}", file=sys.stderr)
            return 127
    try:
        return _run_and_wait(command, {**os.environ, **env})
    finally:
        shutil.rmtree(region_dir, ignore_errors=True)


def _run_region() -> tuple[Path, Path]:
    """A fresh region for one run: a 0750 directory holding a 0660 file, so processes of the
    run under other UIDs of the same group can share it, and nobody else can write it."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    directory = Path(tempfile.mkdtemp(prefix="tessera-isolation-", dir=base))
    os.chmod(directory, 0o750)
    region = directory / "gpu-usage.region"
    fd = os.open(region, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o660)
    os.fchmod(fd, 0o660)
    os.close(fd)
    return directory, region


def _run_and_wait(command: list[str], env: dict[str, str]) -> int:
    """Runs the command as a child (so the run's region can be removed afterwards), passing on
    the signals a terminal or supervisor sends; returns its exit status (128+N for signal N)."""
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        print(f"error: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 127

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, forward)
    rc = child.wait()
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main())

"""Command line of the isolation library.

    python -m tessera.isolation --path
        print where libtessera-cuda.so is (exit 1 with a message if it is not built)
    python -m tessera.isolation --limit 8G [--device-limit 1=4Gi] [--region FILE] -- CMD [ARGS...]
        run CMD under the library with those limits (the environment-only form)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tessera.core.errors import InvalidRequest
from tessera.isolation.config import manual_environment
from tessera.isolation.library import LibraryNotBuilt, library_path


def _device_limit(text: str) -> tuple[int, str]:
    index, sep, quantity = text.partition("=")
    if not sep or not index.strip().isdigit() or not quantity.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected INDEX=QUANTITY, such as 1=4Gi")
    return int(index), quantity.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tessera.isolation",
        description="GPU memory isolation library (libtessera-cuda.so)",
    )
    parser.add_argument("--path", action="store_true", help="print the library's absolute path")
    parser.add_argument("--limit", help="limit for every visible GPU (8G, 8Gi, bytes)")
    parser.add_argument("--device-limit", type=_device_limit, action="append", default=[],
                        metavar="INDEX=QUANTITY", help="limit for one visible GPU; repeatable")
    parser.add_argument("--region", type=Path,
                        help="shared region file, to share the limit with other processes")
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
        env = manual_environment(args.limit, dict(args.device_limit),
                                 region_path=args.region.resolve() if args.region else None,
                                 base=os.environ)
    except LibraryNotBuilt as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except InvalidRequest as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        os.execvpe(command[0], command, {**os.environ, **env})
    except OSError as exc:
        print(f"error: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())

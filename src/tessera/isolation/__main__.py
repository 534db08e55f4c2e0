"""``python -m tessera.isolation --path``: print where the preload library is."""

from __future__ import annotations

import argparse
import sys

from tessera.isolation.library import LibraryNotBuilt, library_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tessera.isolation",
        description="GPU memory isolation library (libtessera-cuda.so)",
    )
    parser.add_argument("--path", action="store_true", help="print the library's absolute path")
    args = parser.parse_args(argv)
    if not args.path:
        parser.print_help()
        return 2
    try:
        print(library_path())
    except LibraryNotBuilt as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where the built ``libtessera-cuda.so`` is (the set-up builds it into this package)."""

from __future__ import annotations

from pathlib import Path

LIBRARY_NAME = "libtessera-cuda.so"
PACKAGE_LIB_DIR = Path(__file__).resolve().parent / "lib"


class LibraryNotBuilt(RuntimeError):
    """The isolation library is missing: the native build has not run on this machine."""


def library_path() -> Path:
    """Absolute path of the preload library; raises LibraryNotBuilt when it is absent."""
    path = PACKAGE_LIB_DIR / LIBRARY_NAME
    if not path.is_file():
        raise LibraryNotBuilt(
            f"{LIBRARY_NAME} is not built (looked for {path}); run ./dev setup, which builds "
            "native/ with gcc (scripts/setup.d/10-native.sh)"
        )
    return path

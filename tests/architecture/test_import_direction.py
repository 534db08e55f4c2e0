"""The import direction of docs/architecture.md, checked on every module in src/tessera.

Every import counts, also those inside functions: a lazy import is still an arrow.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.architecture.imports import _imports, _modules

SRC = Path(__file__).resolve().parents[2] / "src" / "tessera"

HARNESS = {"testing", "bench"}
"""Test and benchmark harness: may import anything, nothing in the product imports it."""

ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "settings": set(),
    "decoding": set(),
    "wire": {"core"},
    "api": {"core"},
    "isolation": {"core"},
    "node": {"core", "isolation", "decoding", "wire"},
    "local": {"core", "api", "isolation", "node", "settings"},
    "kube": {"core", "api", "settings", "decoding", "wire"},
    "cli": {"core", "api", "kube", "local", "settings"},
}
"""For each part of the product, the other parts it may import (the arrows of the diagram)."""

IO_MODULES = {
    "os", "sys", "io", "pathlib", "shutil", "tempfile", "glob", "subprocess", "socket", "ssl",
    "select", "selectors", "signal", "threading", "multiprocessing", "concurrent", "asyncio",
    "sqlite3", "http", "urllib", "logging", "ctypes", "mmap", "fcntl",
}
"""Standard modules that do I/O or touch the process: the core uses none of them."""


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "tessera" else None


def violations(module: str, source: str) -> list[str]:
    """Every import of ``module`` (dotted name) that runs against the direction of imports."""
    here = _part(module)
    if here is None or here in HARNESS:
        return []
    found = []
    for line, name in _imports(ast.parse(source), module):
        where = f"{module}:{line} imports {name}"
        target = _part(name)
        if target is not None and target != here:
            if target in HARNESS:
                found.append(f"{where}: the product never imports the test/bench harness")
            elif target not in ALLOWED.get(here, set()):
                found.append(f"{where}: tessera.{here} may import only "
                             f"{sorted(ALLOWED.get(here, set())) or 'nothing else of tessera'}")
        top = name.split(".")[0]
        if here == "core" and top != "tessera" and top != "__future__":
            if top in IO_MODULES:
                found.append(f"{where}: the core does no I/O")
            elif top not in sys.stdlib_module_names:
                found.append(f"{where}: the core depends on no third-party package")
    return found


def test_every_part_of_the_product_is_named() -> None:
    """A new top-level package must be placed in the diagram before it can import anything."""
    parts = {p.stem if p.is_file() else p.name for p in SRC.iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py")}
    parts.discard("__init__")
    assert parts - set(ALLOWED) - HARNESS == set()


def test_imports_follow_the_direction_of_the_architecture() -> None:
    found = [v for module, path in _modules() for v in violations(module, path.read_text())]
    assert found == []


@pytest.mark.parametrize(("module", "source", "rule"), [
    ("tessera.kube.webhook", "from tessera.testing import cluster", "harness"),
    ("tessera.local.x", "def f():\n    import tessera.bench.api\n", "harness"),
    ("tessera.core.model", "from tessera.local.store import Store", "may import only"),
    ("tessera.core.cycle.run", "from ...local import store", "may import only"),
    ("tessera.core.model", "import subprocess", "no I/O"),
    ("tessera.core.model", "import pydantic", "third-party"),
    ("tessera.kube.scheduler", "from tessera.local import control", "may import only"),
    ("tessera.api.app", "from tessera.kube.api_backend import KubeBackend", "may import only"),
    ("tessera.kube.x", "from tessera import testing", "harness"),
    ("tessera.core.x", "from tessera import local", "may import only"),
    ("tessera.core.cycle.run", "from ... import local", "may import only"),
])
def test_the_check_catches_arrows_that_run_backwards(module: str, source: str, rule: str) -> None:
    found = violations(module, source)
    assert len(found) == 1 and rule in found[0], found


def test_the_check_allows_arrows_of_the_diagram() -> None:
    assert violations("tessera.cli.main", "from tessera.local.server import main") == []
    assert violations("tessera.core.cycle.run", "from . import session\nimport time") == []
    assert violations("tessera.testing.webhook", "from tessera.kube import names") == []
    assert violations("tessera.kube.api_backend", "from tessera import decoding") == []

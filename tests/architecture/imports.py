"""The imports of src/tessera, read with ``ast`` (shared by the architecture tests)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "tessera"


def _imports(tree: ast.AST, module: str) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) for each import in ``tree``, relative ones resolved."""
    package = module.rsplit(".", 1)[0]
    """The package a relative import starts from (for ``x/__init__.py``, module ``x.__init__``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name == "tessera":  # ``from tessera import local``: an arrow to each part named
                for alias in node.names:
                    yield node.lineno, f"tessera.{alias.name}"
            else:
                yield node.lineno, name


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        yield ".".join(rel.parts), path

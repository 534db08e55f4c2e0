"""No two modules of src/tessera import each other, directly or round a loop (every import
counts: inside functions and under ``if TYPE_CHECKING:`` too). A loop means neither module
can be read, tested or changed alone; break it by moving what both need below both."""

from __future__ import annotations

import ast
from collections.abc import Mapping

from tests.architecture.imports import _imports, _modules

KNOWN: dict[frozenset[str], str] = {}
"""Loops not broken yet -> why. A loop not listed fails; a listed one that is gone fails too."""


def graph() -> dict[str, set[str]]:
    modules = {m.removesuffix(".__init__"): p for m, p in _modules()}
    out: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        module = name if path.name != "__init__.py" else f"{name}.__init__"
        tree = ast.parse(path.read_text())
        names = [n for _, n in _imports(tree, module)]
        # ``from tessera.testing import webhook``: an arrow to the submodule itself.
        names += [f"{n}.{alias.name}" for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom)
                  for n in [_from(node, module)] for alias in node.names]
        for imported in names:
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        out[name] = targets
    return out


def _from(node: ast.ImportFrom, module: str) -> str:
    if not node.level:
        return node.module or ""
    base = module.rsplit(".", 1)[0].split(".")
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def loops(g: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(frozenset(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_round_a_loop() -> None:
    found = loops(graph())
    assert [sorted(c) for c in found if c not in KNOWN] == []
    assert [sorted(c) for c in KNOWN if c not in found] == [], "a known loop is gone: unlist it"


def test_the_check_finds_a_loop_through_a_type_only_import() -> None:
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert loops(g) == [frozenset({"a", "b", "c"})]
    assert loops({"a": {"b"}, "b": set()}) == []

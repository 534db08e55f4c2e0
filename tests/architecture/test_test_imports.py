"""No test module imports another test module: what tests share lives in conftest.py or in a
helper module (a name without the ``test_`` prefix), so running, moving or deleting one test
module never changes another's fixtures."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

def imported_test_modules(source: str) -> list[str]:
    """The test modules ``source`` imports (``tests.x.test_y``, at any depth)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                 if isinstance(node, ast.ImportFrom) else [])
        found += [n for n in names
                  if n.startswith("tests.") and n.rsplit(".", 1)[-1].startswith("test_")]
    return found

def test_no_test_module_imports_another() -> None:
    found = {str(p.relative_to(TESTS)): imported_test_modules(p.read_text())
             for p in sorted(TESTS.rglob("*.py"))}
    assert {k: v for k, v in found.items() if v} == {}

def test_the_check_sees_both_import_forms() -> None:
    assert imported_test_modules("from tests.kube.test_admission import runai_pod") \
        == ["tests.kube.test_admission"]
    assert imported_test_modules("import tests.node.test_fake_mig") == ["tests.node.test_fake_mig"]
    assert imported_test_modules("from tests.kube import test_rbac") == ["tests.kube.test_rbac"]
    assert imported_test_modules("from tests.kube.admission_helpers import runai_pod") == []

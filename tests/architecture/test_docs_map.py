"""docs/architecture.md is the map: linked from the README, naming every package under
src/tessera and every folder of native/, and every module it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def test_the_readme_links_the_map() -> None:
    assert "(docs/architecture.md)" in (ROOT / "README.md").read_text()


def test_the_map_names_every_package_and_native_folder() -> None:
    text = DOC.read_text()
    src = ROOT / "src" / "tessera"
    packages = [f"tessera.{p.name}" for p in src.iterdir()
                if p.is_dir() and (p / "__init__.py").exists()]
    packages += [f"tessera.{p.stem}" for p in src.glob("*.py") if p.stem != "__init__"]
    native = [f"native/{p.name}" for p in (ROOT / "native").iterdir() if p.is_dir()
              and p.name != "include"]
    missing = [n for n in packages + native if f"`{n}`" not in text and f"{n}`" not in text]
    assert missing == []


def test_every_module_the_map_names_exists() -> None:
    named = set(re.findall(r"`((?:core|api|local|kube|node|isolation|cli|testing|bench)"
                           r"/[\w/]+\.py)", DOC.read_text()))
    assert named, "the map names modules"
    missing = sorted(n for n in named if not (ROOT / "src" / "tessera" / n).exists())
    assert missing == []

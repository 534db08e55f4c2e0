"""docs/README.md is the map of the documents: it links every file in docs/, and the README
links the map."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_map_links_every_document() -> None:
    text = (ROOT / "docs" / "README.md").read_text()
    linked = set(re.findall(r"\]\(([a-z0-9-]+\.md)\)", text))
    docs = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert docs - linked == set(), f"not in docs/README.md: {sorted(docs - linked)}"
    assert linked - docs == set(), f"linked but missing: {sorted(linked - docs)}"
    assert "(docs/README.md)" in (ROOT / "README.md").read_text()

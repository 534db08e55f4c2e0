"""The ResourceClaim examples of docs/dra.md, read from the document (the DRA tests run them as
written)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml


def doc_claims() -> list[dict[str, Any]]:
    text = (ROOT / "docs" / "dra.md").read_text()
    docs: list[dict[str, Any]] = []
    for block in re.findall(r"^```yaml\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        if "kind: ResourceClaim" in block:  # the slice's block is abridged (…), not YAML
            docs += [d for d in yaml.safe_load_all(block) if d and d["kind"] == "ResourceClaim"]
    return docs


ROOT = Path(__file__).resolve().parents[2]

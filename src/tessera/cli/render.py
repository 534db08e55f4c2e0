"""Printing: aligned plain tables (fast for 10,000 rows), JSON and YAML."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

FORMATS = ("table", "json", "yaml")


def dump(data: Any, fmt: str) -> None:
    if fmt == "json":
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        import yaml

        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, width=120))


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            if len(cell) > widths[i]:
                widths[i] = len(cell)
    last = len(headers) - 1
    lines = []
    for row in [headers, *rows]:
        parts = [cell.ljust(widths[i]) if i < last else cell for i, cell in enumerate(row)]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def age(iso: str | None, now: float | None = None) -> str:
    if not iso:
        return "-"
    then = datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    seconds = max(0, int((now or time.time()) - then))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def gpus(value: float) -> str:
    return f"{value:.2f}"


def size(nbytes: float) -> str:
    if nbytes >= 10**9:
        return f"{nbytes / 10**9:.1f} GB"
    return f"{nbytes / 10**6:.0f} MB"


def bar(fraction: float, width: int = 20) -> str:
    filled = max(0, min(width, round(fraction * width)))
    return "█" * filled + "░" * (width - filled)

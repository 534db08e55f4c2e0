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
    widths = [max(map(len, column)) for column in zip(headers, *rows, strict=True)]
    line = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
    return "\n".join(line.format(*row).rstrip() for row in [headers, *rows])


def age(iso: str | None, now: float | None = None) -> str:
    if not iso:
        return "-"
    then = datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    return _age_text(max(0, int((now or time.time()) - then)))


def _age_text(seconds: int) -> str:
    """kubectl's AGE column: seconds under 2 minutes, minutes under 2 hours, hours under 2 days."""
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


class Ages:
    """``age`` for many ``YYYY-MM-DDTHH:MM:SSZ`` stamps at once: each minute is parsed once."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.minutes: dict[str, float] = {}

    def __call__(self, iso: str | None) -> str:
        if not iso:
            return "-"
        if len(iso) != 20 or iso[-1] != "Z":
            return age(iso, self.now)
        minute = self.minutes.get(iso[:16])
        if minute is None:
            minute = datetime.fromisoformat(iso[:16] + ":00+00:00").timestamp()
            self.minutes[iso[:16]] = minute
        return _age_text(max(0, int(self.now - minute - int(iso[17:19]))))


def gpus(value: float) -> str:
    return f"{value:.2f}"


def size(nbytes: float) -> str:
    """GPU memory in binary units, as nvidia-smi shows it (16 GiB for a 16 GB V100)."""
    from tessera.core.units import format_bytes

    return format_bytes(nbytes)


def bar(fraction: float, width: int = 20) -> str:
    filled = max(0, min(width, round(fraction * width)))
    return "█" * filled + "░" * (width - filled)

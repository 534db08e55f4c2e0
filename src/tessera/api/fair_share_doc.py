"""A project's fair share as the API shows it, the same on both backends: the GPUs of its fair
share after the last scheduling cycle, how many of them usage history gave (negative: took) and
its decayed usage (time-based fair share, docs/scheduling.md), in the project's ``status``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI imports this module: it must not pull in the whole cycle
    from tessera.core.cycle import ProjectStatus


def fair_share_status(ps: ProjectStatus) -> dict[str, Any]:
    """The status fields (the Project CRD's ``status`` has the same names)."""
    return {"fairShare": {"gpu": round(float(ps.fair_share[0]), 4)},
            "fromUsageHistory": {"gpu": round(ps.from_usage, 2)},
            "usageGpuHours": round(ps.usage / 3600.0, 1)}  # coarse: not rewritten every cycle


def fair_share_text(status: Mapping[str, Any]) -> str | None:
    """``fair share 2.3 GPU, of which 0.4 from usage history`` (or ``... 0.4 taken by usage
    history``), or None when the status has no fair share yet."""
    share = (status.get("fairShare") or {}).get("gpu")
    if share is None:
        return None
    text = f"fair share {_g(share)} GPU"
    history = (status.get("fromUsageHistory") or {}).get("gpu") or 0.0
    if abs(history) >= 5e-3:
        text += (f", of which {_g(history)} from usage history" if history > 0
                 else f", {_g(-history)} less due to usage history")
    return text


def _g(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".") if x != int(x) else f"{x:g}"

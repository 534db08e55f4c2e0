"""The time-based fair share flags, the same on ``tessera up`` (embedded), ``tessera.local.server``
and ``tessera-scheduler`` (Kubernetes; Helm ``policy.fairShareHistory``); see
tessera.core.usage_history for the syntax and docs/scheduling.md for the formula."""

from __future__ import annotations

import argparse
import os

from tessera.core.usage_history import UsageHistory, parse_override, parse_policy, parse_save_every

FLAG = "--fair-share-history"
FOR_FLAG = "--fair-share-history-for"
ENV = "TESSERA_FAIR_SHARE_HISTORY"
FOR_ENV = "TESSERA_FAIR_SHARE_HISTORY_FOR"
"""Environment fallbacks; the per-department one holds overrides separated by spaces."""


def add_history_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(FLAG, default=None, metavar="SETTINGS",
                        help="time-based fair share: off (default) or window=7d,half-life=1d,k=1,"
                        f"save-every=30s (any subset; env {ENV})")
    parser.add_argument(FOR_FLAG, action="append", default=None, metavar="NAME:SETTINGS",
                        help="a department's (or project's) own window and half-life, e.g. "
                        f"research:window=1d,half-life=6h; repeatable (env {FOR_ENV})")


def history_from_args(args: argparse.Namespace) -> UsageHistory:
    """The usage history the flags ask for; :class:`~tessera.core.errors.InvalidRequest` naming
    the flag and the rule when they are wrong (nothing is started then)."""
    text = args.fair_share_history if args.fair_share_history is not None else os.environ.get(ENV)
    policy = parse_policy(FLAG, text)
    overrides_text = args.fair_share_history_for
    if overrides_text is None:
        overrides_text = os.environ.get(FOR_ENV, "").split()
    overrides = dict(parse_override(FOR_FLAG, o) for o in overrides_text)
    if overrides and policy is None:
        from tessera.core.errors import InvalidRequest

        raise InvalidRequest(FOR_FLAG, f"needs {FLAG} (time-based fair share is off)",
                             " ".join(overrides_text))
    return UsageHistory(policy, overrides, parse_save_every(FLAG, text))

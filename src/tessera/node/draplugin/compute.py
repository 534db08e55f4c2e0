"""Compute share for DRA claims (docs/compute-share.md, docs/dra.md): a claim allocated with
``consumedCapacity.compute`` (its compute request) gets its entry in its GPUs' arbiters, owned by
tessera-node (:mod:`tessera.node.compute_arbiters`, the node's ledger directory, which the CDI
edits already mount at ``/run/tessera-loans``), and ``gpu-compute.conf`` in the claim's config
directory (mounted at ``/etc/tessera``, where the library looks), both before the kubelet is told
the claim is prepared: the container cannot start ungated. A claim asks no limit, so its limit is
the whole GPU (fair: it bursts into idle time). Entries are removed when the claim is
unprepared."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from tessera.core import compute
from tessera.core.compute_claim import compute_limit
from tessera.core.errors import InvalidRequest
from tessera.isolation import arbiter
from tessera.node.compute_arbiters import (
    CONF_NAME,
    ComputeArbiters,
    ComputeEntry,
    ComputeSetupError,
    arbiter_dir,
)
from tessera.node.draplugin.cdi import ClaimDevice, PluginConfig, check_uid

FIELD = "status.allocation.devices.results.consumedCapacity.compute"


def claim_compute(claim: Mapping[str, Any]) -> Decimal | None:
    """The compute request the claim was allocated (the largest over its devices); None: none."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    found = [compute.parse_quantity(text, FIELD) for r in results
             if (text := (r.get("consumedCapacity") or {}).get("compute")) is not None]
    best = max(found, default=None)
    return best if best else None


def prepare_compute(cfg: PluginConfig, uid: str, devices: Sequence[ClaimDevice], claim: Mapping[str, Any],
                    priority_class: str = "") -> None:
    """Writes the claim's arbiter entries and gpu-compute.conf; raises InvalidRequest naming the
    field when its compute share cannot be enforced here (the claim is then not prepared)."""
    request = claim_compute(claim)
    if request is None:
        return
    if cfg.claims_dir is None or cfg.loans_host_dir is None:
        raise InvalidRequest(FIELD, "cannot be enforced on this node: tessera-node runs without a claims or "
                             "ledger directory (fails closed)", str(request))
    limit = compute_limit(claim, request)  # spec.devices.config's ComputeShare; None: 1
    entry = ComputeEntry(check_uid(uid), tuple(d.uuid for d in devices), float(request),
                         float(limit) if limit is not None else 1.0, latency=priority_class == "inference")
    try:
        text = ComputeArbiters(cfg.loans_host_dir).apply(entry)
        conf = cfg.claims_dir / uid / "conf" / CONF_NAME
        tmp = conf.with_name(f".tmp-{CONF_NAME}.{os.getpid()}")
        tmp.write_text(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, conf)
    except (ComputeSetupError, OSError) as exc:
        raise InvalidRequest(FIELD, f"cannot be enforced: {exc}", str(request)) from None


def release_compute(cfg: PluginConfig, uid: str) -> None:
    """Removes the claim's entries from every arbiter of this node."""
    if cfg.loans_host_dir is None or not arbiter_dir(cfg.loans_host_dir).is_dir():
        return
    for path in arbiter_dir(cfg.loans_host_dir).glob("*.share"):
        with contextlib.suppress(OSError, arbiter.ArbiterError):
            arbiter.remove_share(path, uid)

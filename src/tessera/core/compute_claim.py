"""A DRA claim's compute limit (burst ceiling; issue 30, docs/compute-share.md, docs/dra.md).

DRA's ``capacity.requests`` has no limit beside the request, so the limit is the driver's own
configuration, where DRA puts every driver-specific setting: an opaque config of driver
``gpu.tessera.io`` (as NVIDIA's DRA driver takes its sharing settings)::

    spec:
      devices:
        requests:
        - name: gpu
          exactly: {deviceClassName: share.gpu.tessera.io,
                    capacity: {requests: {shares: "50", compute: 300m}}}
        config:
        - requests: [gpu]                       # optional: the request it applies to
          opaque:
            driver: gpu.tessera.io
            parameters: {apiVersion: gpu.tessera.io/v1, kind: ComputeShare, computeLimit: 800m}

Rules, each refused naming the field: one such config; ``apiVersion``/``kind`` as above; only
``computeLimit``, a quantity in [0, 1] (``800m`` or ``0.8``); the claim must ask for a compute
request (``capacity.requests.compute``), and the limit may not be below it. Without a config the
limit is 1 (the share bursts into idle time, as fair mode does).

Pure: the scheduler (kube/claims.py, at placement) and the kubelet plugin
(node/draplugin/compute.py, at prepare) read the same claim the same way."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from tessera.core.compute import parse_quantity
from tessera.core.errors import InvalidRequest

DRIVER = "gpu.tessera.io"
API_VERSION = "gpu.tessera.io/v1"
KIND = "ComputeShare"


def _where(claim: Mapping[str, Any], rest: str) -> str:
    return f"resourceclaim {(claim.get('metadata') or {}).get('name', '?')}: {rest}"


def compute_limit(claim: Mapping[str, Any], request: Decimal | None) -> Decimal | None:
    """The limit the claim's ``spec.devices.config`` sets, or None when it sets none. ``request``
    is the claim's compute request (None: it asks for none). Raises InvalidRequest naming the
    field for any config tessera does not take (nothing is then allocated or prepared)."""
    configs = ((claim.get("spec") or {}).get("devices") or {}).get("config") or []
    if not isinstance(configs, list):
        raise InvalidRequest(_where(claim, "spec.devices.config"), "must be a list", str(configs)[:40])
    found: Decimal | None = None
    for i, cfg in enumerate(configs):
        where = f"spec.devices.config[{i}]"
        opaque = (cfg or {}).get("opaque") if isinstance(cfg, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != DRIVER:
            raise InvalidRequest(_where(claim, f"{where}.opaque.driver"),
                                 f"tessera-scheduler takes only an opaque config of driver {DRIVER} "
                                 f"(kind {KIND}: the compute limit)",
                                 str((opaque or {}).get("driver") if isinstance(opaque, Mapping) else cfg)[:60])
        params = opaque.get("parameters")
        if not isinstance(params, Mapping) or params.get("apiVersion") != API_VERSION \
                or params.get("kind") != KIND:
            raise InvalidRequest(_where(claim, f"{where}.opaque.parameters"),
                                 f"must be apiVersion {API_VERSION}, kind {KIND}",
                                 str(params)[:80])
        unknown = sorted(set(params) - {"apiVersion", "kind", "computeLimit"})
        if unknown:
            raise InvalidRequest(_where(claim, f"{where}.opaque.parameters.{unknown[0]}"),
                                 f"is not a field of {KIND} (computeLimit)")
        if found is not None:
            raise InvalidRequest(_where(claim, where), f"one {KIND} config per claim")
        name = _where(claim, f"{where}.opaque.parameters.computeLimit")
        if "computeLimit" not in params:
            raise InvalidRequest(name, "is required: the share's ceiling of the GPU's time, such as 800m")
        found = parse_quantity(params["computeLimit"], name)
        if not request:
            raise InvalidRequest(name, "needs a compute request beside it "
                                 "(capacity.requests.compute, such as 300m)", str(params["computeLimit"]))
        if found < request:
            raise InvalidRequest(name, f"must be at least the compute request ({request}): "
                                 "a limit is a ceiling above the guaranteed share",
                                 str(params["computeLimit"]))
    return found

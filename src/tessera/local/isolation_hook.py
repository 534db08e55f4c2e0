"""The bridge to the GPU memory isolation library (``tessera.isolation``), when it exists.

Until that library is present and configured, shared pods run with ``isolation: off`` and the
describe output says so. Once it is configured, a pod whose share cannot be capped does not start
(fail closed): ``env`` raises instead of returning an uncapped environment.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Protocol

from tessera.core.errors import InvalidRequest
from tessera.core.state import Placement


class Isolation(Protocol):
    def describe(self) -> str: ...

    def env(self, key: str, uuids: list[str], placement: Placement) -> dict[str, str]: ...


class Off:
    def describe(self) -> str:
        return "off (the isolation library is not installed; shares are not enforced)"

    def env(self, key: str, uuids: list[str], placement: Placement) -> dict[str, str]:
        return {}


class Library:
    """Adapts ``tessera.isolation``'s ``workload_env`` to the runner; refuses to run uncapped."""

    def __init__(self, module: Any, data_dir: Path) -> None:
        self.module = module
        self.dir = data_dir / "isolation"
        self.dir.mkdir(parents=True, exist_ok=True)

    def describe(self) -> str:
        return "on (tessera.isolation caps each shared device at its limit)"

    def env(self, key: str, uuids: list[str], placement: Placement) -> dict[str, str]:
        try:
            env = self.module.workload_env(
                config_dir=self.dir / key,
                uuids=uuids,
                limit_bytes=list(placement.limit_bytes),
                request_bytes=list(placement.request_bytes),
            )
        except Exception as exc:
            raise InvalidRequest("isolation", f"cannot cap this share, so it does not run: {exc}") from exc
        result = {str(k): str(v) for k, v in dict(env).items()}
        result["TESSERA_ISOLATION"] = "on"
        return result


def load(data_dir: Path) -> Isolation:
    try:
        module = importlib.import_module("tessera.isolation")
    except ImportError:
        return Off()
    if not callable(getattr(module, "workload_env", None)):
        return Off()
    return Library(module, data_dir)

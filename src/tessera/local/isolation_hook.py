"""The bridge to the GPU memory isolation library (``tessera.isolation``), when it exists.

Until that library is present and configured, shared pods run with ``isolation: off`` and the
describe output says so. Once it is configured, a pod whose share cannot be capped does not start
(fail closed): ``env`` raises instead of returning an uncapped environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from tessera.core.errors import InvalidRequest
from tessera.core.state import Placement


class Isolation(Protocol):
    def describe(self) -> str: ...

    def env(
        self, key: str, uuids: list[str], placement: Placement, base: dict[str, str],
        priority: int = 0,
    ) -> dict[str, str]: ...


class Off:
    def __init__(self, why: str) -> None:
        self.why = why

    def describe(self) -> str:
        return f"off ({self.why}; shares are not enforced)"

    def env(
        self, key: str, uuids: list[str], placement: Placement, base: dict[str, str],
        priority: int = 0,
    ) -> dict[str, str]:
        return {}


class Library:
    """``libtessera-cuda.so`` preloaded with one config file per pod; refuses to run uncapped."""

    def __init__(self, data_dir: Path, library: Path,
                 headroom: Mapping[str, int] | None = None) -> None:
        self.dir = data_dir / "isolation"
        self.library = library
        self.headroom = dict(headroom or {})
        """Bytes each GPU (by UUID) keeps for a CUDA context: charged per context a pod creates."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.loans_dir = data_dir / "loans"
        """The node-wide ledger per GPU (one file per UUID) every share's processes write: memory
        above a request is lent only from what nobody is guaranteed, and taken back by the
        reclaimer (tessera.node.reclaim) when an owner needs it."""

    def describe(self) -> str:
        return f"on ({self.library.name} preloaded; caps each shared device at its limit)"

    def env(
        self, key: str, uuids: list[str], placement: Placement, base: dict[str, str],
        priority: int = 0,
    ) -> dict[str, str]:
        from tessera.isolation import DeviceShare, process_environment, write_workload_files
        from tessera.isolation.config import DEFAULT_WAIT_MS, LoansConfig
        from tessera.node.reclaim import prepare_directory

        try:
            shares = [
                DeviceShare(index=i, uuid=uuid, limit_bytes=limit, request_bytes=request)
                for i, (uuid, request, limit) in enumerate(
                    zip(uuids, placement.request_bytes, placement.limit_bytes, strict=True)
                )
            ]
            overhead = max((self.headroom.get(u, 0) for u in uuids), default=0)
            loans = LoansConfig(prepare_directory(self.loans_dir), share=key, priority=priority,
                                wait_ms=DEFAULT_WAIT_MS, headroom_bytes=overhead)
            files = write_workload_files(self.dir / key, shares, context_overhead_bytes=overhead,
                                         loans=loans)
            env = process_environment(files, library=self.library, base=base)
        except Exception as exc:
            raise InvalidRequest(
                "isolation", f"cannot cap this share, so it does not run: {exc}"
            ) from exc
        result = {str(k): str(v) for k, v in env.items()}
        result["TESSERA_ISOLATION"] = "on"
        return result


def load(data_dir: Path, headroom: Mapping[str, int] | None = None) -> Isolation:
    """The library when it is installed and built (``./dev setup``), else ``Off`` saying why."""
    try:
        from tessera.isolation import LibraryNotBuilt, library_path
    except ImportError:
        return Off("the isolation package is not installed")
    try:
        return Library(data_dir, library_path(), headroom)
    except LibraryNotBuilt:
        return Off("libtessera-cuda.so is not built; run ./dev setup")

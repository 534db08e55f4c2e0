"""A workload's isolation files and the environment its processes get.

The local runner and the node agent call :func:`write_workload_files` once per workload (one
directory per workload), then start every process of the workload with
:func:`process_environment`. The file format is documented in docs/isolation.md; the C parser
(native/isolation/config.c) refuses anything else and then fails closed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tessera.core.errors import InvalidRequest
from tessera.core.units import parse_memory
from tessera.isolation.library import library_path

CONFIG_ENV = "TESSERA_GPU_CONFIG"
DEFAULT_WAIT_MS = 10_000
"""How long a borrower's allocation waits for the reclaimer to free a loan (``wait_ms``), in
milliseconds."""
LIMIT_ENV = "TESSERA_GPU_MEMORY_LIMIT"
REGION_ENV = "TESSERA_GPU_SHARED_REGION"
CONTEXT_OVERHEAD_ENV = "TESSERA_GPU_CONTEXT_OVERHEAD"
LOG_ENV = "TESSERA_ISOLATION_LOG"

CONFIG_HEADER = "tessera-gpu-isolation 1"
CONFIG_NAME = "gpu-isolation.conf"
REGION_NAME = "gpu-usage.region"
MAX_DEVICES = 32
_UUID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$")
_SHARE = re.compile(r"^[A-Za-z0-9_.-]{1,63}$")


@dataclass(frozen=True)
class DeviceShare:
    """One device of a workload: its CUDA-visible index inside the workload, its UUID, and
    the bytes guaranteed (request) and allowed (limit). A missing request equals the limit."""

    index: int | None
    uuid: str | None
    limit_bytes: int
    request_bytes: int | None = None

    def request(self) -> int:
        return self.limit_bytes if self.request_bytes is None else self.request_bytes


@dataclass(frozen=True)
class LoansConfig:
    """The ``loans`` line: the node-wide ledger directory (one file per GPU UUID), the share's key
    on the node, its priority (lower is reclaimed first), how long an allocation within the request
    waits for a reclaim, and the GPU memory kept back (headroom) from what workloads can hold."""

    directory: Path
    share: str
    priority: int = 0
    wait_ms: int = 10_000
    headroom_bytes: int = 0

    def render(self) -> str:
        if not Path(self.directory).is_absolute() or any(c.isspace() for c in str(self.directory)):
            raise InvalidRequest("loans.directory", "must be an absolute path without spaces",
                                 str(self.directory))
        if not _SHARE.match(self.share):
            raise InvalidRequest("loans.share", "must be 1 to 63 letters, digits, '-', '_' or '.'",
                                 self.share)
        if isinstance(self.priority, bool) or not isinstance(self.priority, int) \
                or abs(self.priority) > 1_000_000_000:
            raise InvalidRequest("loans.priority", "must be a whole number", self.priority)
        if isinstance(self.wait_ms, bool) or not isinstance(self.wait_ms, int) \
                or not 0 <= self.wait_ms <= 3_600_000:
            raise InvalidRequest("loans.wait_ms", "must be 0 to 3600000 milliseconds", self.wait_ms)
        if isinstance(self.headroom_bytes, bool) or not isinstance(self.headroom_bytes, int) \
                or self.headroom_bytes < 0:
            raise InvalidRequest("loans.headroom_bytes", "must be a whole number of bytes, 0 or more",
                                 self.headroom_bytes)
        return (f"loans dir={self.directory} share={self.share} priority={self.priority} "
                f"wait-ms={self.wait_ms} headroom={self.headroom_bytes}")


@dataclass(frozen=True)
class IsolationFiles:
    config_path: Path
    region_path: Path


def _check_device(share: DeviceShare, field: str) -> None:
    if share.index is None and not share.uuid:
        raise InvalidRequest(field, "needs an index, a uuid or both", share)
    if share.index is not None and (
        isinstance(share.index, bool) or not isinstance(share.index, int)
        or not 0 <= share.index < MAX_DEVICES
    ):
        raise InvalidRequest(f"{field}.index", f"must be a whole number from 0 to {MAX_DEVICES - 1}",
                             share.index)
    if share.uuid is not None and not _UUID.match(share.uuid):
        raise InvalidRequest(f"{field}.uuid",
                             "must be a device UUID such as GPU-8e3f... (letters, digits, -_.:, "
                             "at most 63 characters)", share.uuid)
    for name, value in (("limit_bytes", share.limit_bytes), ("request_bytes", share.request())):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InvalidRequest(f"{field}.{name}", "must be a whole number of bytes greater than 0",
                                 value)
    if share.request() > share.limit_bytes:
        raise InvalidRequest(f"{field}.request_bytes", "must not exceed limit_bytes",
                             share.request_bytes)


def render_config(devices: Sequence[DeviceShare], region_path: Path,
                  context_overhead_bytes: int = 0, loans: LoansConfig | None = None) -> str:
    """The configuration file's text; raises InvalidRequest naming the field that is wrong."""
    if not devices:
        raise InvalidRequest("devices", "a workload needs at least one device", [])
    if len(devices) > MAX_DEVICES:
        raise InvalidRequest("devices", f"at most {MAX_DEVICES} devices", len(devices))
    if not Path(region_path).is_absolute():
        raise InvalidRequest("region_path", "must be an absolute path", str(region_path))
    if "\n" in str(region_path):
        raise InvalidRequest("region_path", "must not contain a newline", str(region_path))
    if (isinstance(context_overhead_bytes, bool) or not isinstance(context_overhead_bytes, int)
            or context_overhead_bytes < 0):
        raise InvalidRequest("context_overhead_bytes", "must be a whole number of bytes, 0 or more",
                             context_overhead_bytes)
    seen_index: set[int] = set()
    seen_uuid: set[str] = set()
    lines = [CONFIG_HEADER, f"region {region_path}", f"context-overhead {context_overhead_bytes}"]
    if loans is not None:
        lines.append(loans.render())
    for i, share in enumerate(devices):
        field = f"devices[{i}]"
        _check_device(share, field)
        if share.index is not None:
            if share.index in seen_index:
                raise InvalidRequest(f"{field}.index", "must be unique within a workload", share.index)
            seen_index.add(share.index)
        if share.uuid:
            if share.uuid in seen_uuid:
                raise InvalidRequest(f"{field}.uuid", "must be unique within a workload", share.uuid)
            seen_uuid.add(share.uuid)
        parts = ["device"]
        if share.index is not None:
            parts.append(f"index={share.index}")
        if share.uuid:
            parts.append(f"uuid={share.uuid}")
        parts += [f"request={share.request()}", f"limit={share.limit_bytes}"]
        lines.append(" ".join(parts))
    return "\n".join(lines) + "\n"


def _write_atomic(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def write_workload_files(directory: Path, devices: Sequence[DeviceShare], *,
                         context_overhead_bytes: int = 0,
                         loans: LoansConfig | None = None) -> IsolationFiles:
    """Writes ``gpu-isolation.conf`` and creates an empty ``gpu-usage.region`` in directory.

    The region is created empty, group-shareable and not world-writable (0660), so processes of
    the workload running as other users of its group can attach; the library lays it out on
    first use. A directory created here is 0750; an existing one is left as it is. An existing region is kept (processes of the workload may already be using it).
    Nothing is written if a value is invalid.
    """
    directory = Path(directory).resolve()
    region = directory / REGION_NAME
    text = render_config(devices, region, context_overhead_bytes, loans)
    if not directory.is_dir():
        directory.mkdir(parents=True)
        os.chmod(directory, 0o750)  # the workload's group may read it; nobody else
    if not region.exists():
        fd = os.open(region, os.O_CREAT | os.O_WRONLY, 0o660)
        os.close(fd)
        os.chmod(region, 0o660)
    config = directory / CONFIG_NAME
    _write_atomic(config, text, 0o644)
    return IsolationFiles(config_path=config, region_path=region)


def _with_preload(library: Path, existing: str | None) -> str:
    parts = [str(library)]
    if existing:
        parts += [p for p in re.split(r"[:\s]+", existing) if p and p != str(library)]
    return ":".join(parts)


def process_environment(files: IsolationFiles, *, library: Path | None = None,
                        base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Variables to add to a workload process's environment: the preload and the config path.

    ``base`` is the environment the process would otherwise get; an LD_PRELOAD already there is
    kept after ours. Limit variables in ``base`` are not removed: the config file wins over them.
    """
    lib = library or library_path()
    existing = (base or {}).get("LD_PRELOAD")
    return {"LD_PRELOAD": _with_preload(lib, existing), CONFIG_ENV: str(files.config_path)}


_MAX_BYTES = 2**64 - 1


def _limit_bytes(value: str | int, field: str) -> int:
    """A limit the library accepts: 1 byte to 2^64-1 bytes (it refuses anything else)."""
    n = parse_memory(value, field)
    if not 0 < n <= _MAX_BYTES:
        raise InvalidRequest(field, "must be from 1 byte to 16Ei (2^64-1 bytes)", value)
    return n


def manual_environment(limit: str | int | None = None,
                       per_device: Mapping[int, str | int] | Mapping[str, str | int] | None = None,
                       *, region_path: Path | None = None, library: Path | None = None,
                       base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment-only form, for running something by hand (no config file).

    ``limit`` applies to every visible device, ``per_device`` to visible index i or to the GPU
    with that UUID (``GPU-...``/``MIG-...``: the limit follows the GPU whatever
    ``CUDA_VISIBLE_DEVICES`` the program sets; ``python -m tessera.isolation`` keys by UUID); both are
    Kubernetes quantities (``8G``, ``8Gi``) or bytes. Values are validated here the way the
    library validates them, so a typo fails now rather than closing the GPU later.
    """
    env = {"LD_PRELOAD": _with_preload(library or library_path(), (base or {}).get("LD_PRELOAD"))}
    if limit is None and not per_device:
        raise InvalidRequest("limit", "give a limit for every device, per_device limits, or both")
    if limit is not None:
        env[LIMIT_ENV] = str(_limit_bytes(limit, "limit"))
    for index, value in (per_device or {}).items():
        if isinstance(index, str) and index.startswith(("GPU-", "MIG-")) and len(index) < 64 and all(
                c in "0123456789abcdefABCDEF-/" for c in index[4:]):
            env[f"{LIMIT_ENV}_{index}"] = str(_limit_bytes(value, f"per_device[{index}]"))
            continue
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < MAX_DEVICES:
            raise InvalidRequest("per_device", f"keys must be visible device indexes 0 to {MAX_DEVICES - 1}",
                                 index)
        env[f"{LIMIT_ENV}_{index}"] = str(_limit_bytes(value, f"per_device[{index}]"))
    if region_path is not None:
        if not Path(region_path).is_absolute():
            raise InvalidRequest("region_path", "must be an absolute path", str(region_path))
        env[REGION_ENV] = str(region_path)
    return env

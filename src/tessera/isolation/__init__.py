"""GPU memory isolation: the preload library ``libtessera-cuda.so`` and what it needs to run.

The library (C, ``native/isolation/``) caps each workload's GPU memory per device. This package
finds the built library, writes a workload's configuration and shared-region files, and returns
the environment a process needs. docs/isolation.md describes the files and every variable.
"""

from tessera.isolation.config import (
    CONFIG_ENV,
    CONTEXT_OVERHEAD_ENV,
    LIMIT_ENV,
    LOG_ENV,
    REGION_ENV,
    DeviceShare,
    IsolationFiles,
    manual_environment,
    process_environment,
    render_config,
    write_workload_files,
)
from tessera.isolation.library import LIBRARY_NAME, LibraryNotBuilt, library_path
from tessera.isolation.region import DeviceUsage, read_region

__all__ = [
    "CONFIG_ENV",
    "CONTEXT_OVERHEAD_ENV",
    "LIBRARY_NAME",
    "LIMIT_ENV",
    "LOG_ENV",
    "REGION_ENV",
    "DeviceShare",
    "DeviceUsage",
    "IsolationFiles",
    "LibraryNotBuilt",
    "library_path",
    "manual_environment",
    "process_environment",
    "read_region",
    "render_config",
    "write_workload_files",
]

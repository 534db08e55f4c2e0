"""The fake NVML with a GPU in MIG mode, driven from a fresh process (tests of node/, local/, kube/
and the console share it)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from typing import Any

A100_40 = "NVIDIA A100-SXM4-40GB=40Gi"


def nvml(env: Mapping[str, str], code: str) -> Any:
    """Runs code after PRELUDE in a fresh process on the fake NVML; returns its `out`."""
    program = PRELUDE + textwrap.dedent(code) + "\nprint(json.dumps(out))\n"
    done = subprocess.run([sys.executable, "-c", program], env=dict(env), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


PRELUDE = """
import ctypes, json, pynvml as nv
nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(0)
def err(fn, *a):
    try:
        fn(*a)
    except nv.NVMLError as e:
        return e.value
    return 0
def place(start, size):
    p = nv.c_nvmlGpuInstancePlacement_t()
    p.start, p.size = start, size
    return ctypes.byref(p)
"""

"""#28: a bounded fuzzer over the hooked entry points (native/tests/fuzz_hooks.c), run against
the library built with AddressSanitizer + UBSan (any finding aborts) on the fake driver: sizes
near SIZE_MAX, foreign and stale pointers, double frees, pool memory freed by the other API, VMM
handles released and unmapped twice, odd ranges, context limits, NULL out-pointers. After every
call the driver's own count for the process must stay within the limit.

``TESSERA_FUZZ_SECONDS`` (default 5) bounds the run; the seed is printed so a failure replays."""

from __future__ import annotations

import os
import random
import shutil
import subprocess

from tests.isolation.conftest import GiB, clean_env


def test_hooked_entry_points_under_sanitizers(native) -> None:  # type: ignore[no-untyped-def]
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("gcc")
    assert cc, "the native build needs gcc"
    asan = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    assert os.path.isabs(asan) and os.path.exists(asan), asan
    seconds = os.environ.get("TESSERA_FUZZ_SECONDS", "5")
    seed = random.randrange(1, 2**63)
    env = clean_env(native, devices="NVIDIA H100 80GB HBM3=81559Mi;NVIDIA H100 80GB HBM3=81559Mi",
                    extra={"TESSERA_GPU_MEMORY_LIMIT": str(GiB), "TESSERA_ISOLATION_LOG": "off",
                           # the fake driver keeps what the program never frees: not a finding
                           "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
                           "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"})
    env["LD_PRELOAD"] = f"{asan} {native.root / 'asan' / 'libtessera-cuda.so'}"
    done = subprocess.run([str(native.program("fuzz_hooks")), seconds, str(seed), str(GiB)], env=env,
                          capture_output=True, text=True, timeout=float(seconds) + 120)
    assert done.returncode == 0, f"seed {seed}:\n{done.stderr[-4000:]}"
    fields = dict(t.split("=") for t in done.stdout.split())
    assert int(fields["calls"]) > 1000 and int(fields["held_max"]) <= GiB

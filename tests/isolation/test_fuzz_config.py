"""The configuration parser under AddressSanitizer + UBSan (native/tests/fuzz_config.c).

The fuzzer first replays the inputs that once crashed or misparsed (128 fraction digits: a
division by zero; 295147905179352825857Ei: wrapped to 1 EiB; more than 32 per-device variables
and zero-padded duplicates: an array overrun; empty values: taken as "no limit"), then runs random
quantities, environments and configuration files for a bounded time, checking each result against
invariants (see the program's header). TESSERA_FUZZ_SECONDS sets the time (default 5 s).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.isolation.conftest import GiB, clean_env


def test_parser_fuzz_under_sanitizers(native, tmp_path):
    seconds = os.environ.get("TESSERA_FUZZ_SECONDS", "5")
    result = subprocess.run([str(native.program("fuzz_config")), seconds, "12345"],
                            capture_output=True, text=True, timeout=float(seconds) + 60,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "fuzz_config: ok" in result.stdout
    assert int(result.stdout.split("cases=")[-1].split()[0]) > 1000


@pytest.mark.parametrize("env", [
    {"TESSERA_GPU_MEMORY_LIMIT": ""},
    {"TESSERA_GPU_MEMORY_LIMIT_0": ""},
    {"TESSERA_GPU_MEMORY_LIMIT": "8Gi", "TESSERA_GPU_CONTEXT_OVERHEAD": ""},
    {"TESSERA_GPU_MEMORY_LIMIT_0": "1Gi", "TESSERA_GPU_MEMORY_LIMIT_00": "2Gi"},
    {"TESSERA_GPU_MEMORY_LIMIT_01": "1Gi"},
    {"TESSERA_GPU_MEMORY_LIMIT": "295147905179352825857Ei"},
    {"TESSERA_GPU_MEMORY_LIMIT": "1." + "3" * 128},
    {f"TESSERA_GPU_MEMORY_LIMIT_{i}": "1Gi" for i in range(40)},
    {"TESSERA_GPU_CONFIG": ""},
])
def test_bad_environment_fails_closed_naming_the_variable(native, probe, env):
    p = probe(clean_env(native, extra=env)).start()
    assert p("alloc 1")["rc"] == 2
    assert p.info() == (0, 0)
    err = p.stderr()
    assert "fail closed" in err and "TESSERA_GPU_" in err


def test_fraction_of_a_byte_rounds_up_and_long_zero_fractions_parse(native, probe):
    p = probe(clean_env(native, extra={"TESSERA_GPU_MEMORY_LIMIT": "1." + "0" * 128 + "Gi"})).start()
    assert p.info()[1] == GiB

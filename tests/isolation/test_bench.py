"""The benchmark runs and reports its numbers (its speed is recorded in docs, never asserted)."""

from __future__ import annotations

import json
import shutil

from tessera.bench import isolation as bench
from tessera.isolation.build import ensure_built


def test_benchmark_prints_one_json_object_last(capsys):
    assert bench.main(["--pairs", "2000", "--repeats", "1", "--live", "500"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(last)
    assert result["benchmark"] == "isolation"
    for key in ("baseline_ns_per_pair", "passthrough_ns_per_pair", "limited_ns_per_pair",
                "shared_region_ns_per_pair"):
        assert result[key] > 0
    assert result["overhead_ns_per_pair"] == round(
        result["shared_region_ns_per_pair"] - result["baseline_ns_per_pair"], 1)
    for key in ("two_threads_baseline_ns_per_pair", "two_threads_shared_region_ns_per_pair",
                "map_unmap_baseline_ns", "map_unmap_shared_region_ns"):
        assert result[key] > 0
    assert result["live_mappings"] == 500
    for key in ("overhead_paired_median_ns_per_pair", "overhead_fastest_ns_per_pair"):
        assert isinstance(result[key], float)


def test_benchmark_compares_another_library_and_counts_instructions(capsys, tmp_path):
    """--compare runs a second build in the same rounds; --instructions counts a pair's
    instructions under valgrind, --waits the blocking waits at 2 threads under strace
    (scripts/setup.d/40-valgrind.sh installs both)."""
    for tool in ("valgrind", "strace"):
        assert shutil.which(tool), f"{tool} missing: scripts/setup.d/40-valgrind.sh installs it"
    other = tmp_path / "libtessera-cuda.so"
    shutil.copy(ensure_built().library, other)
    argv = ["--pairs", "2000", "--repeats", "1", "--live", "500", "--compare", str(other),
            "--instructions", "--waits"]
    assert bench.main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["compare_library"] == str(other)
    assert isinstance(result["compare_overhead_ns_per_pair"], float)
    assert isinstance(result["compare_two_threads_overhead_ns_per_pair"], float)
    assert result["instructions_per_pair_shared_region"] > result["instructions_per_pair_baseline"] > 0
    for name in ("baseline", "shared_region", "compare"):  # counted, not asserted: they vary
        assert result[f"two_threads_waits_per_1000_pairs_{name}"] >= 0

"""#12 item 3: one budget per workload by default in ``python -m tessera.isolation``.

Every process the command starts shares one region, created for the run (0660 in a 0750
directory) and removed when the command ends; ``--per-process`` keeps the old behaviour where
each process gets the full limit. With the library before this change, both processes below got
their 5 GiB under an 8 GiB limit.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.isolation.conftest import GiB, clean_env


def two_probes_script(native) -> str:
    probe = native.program("cuprobe")
    one = f"(printf 'init\\nctx 0\\nalloc {5 * GiB}\\n'; sleep 1) | {probe} dlsym"
    return (f'stat -c "region %a %n" "$TESSERA_GPU_SHARED_REGION"; '
            f'stat -c "dir %a" "$(dirname "$TESSERA_GPU_SHARED_REGION")"; '
            f"{one} > a.out & {one} > b.out & wait; cat a.out b.out")


def run_cli(native, tmp_path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = clean_env(native, preload=False, extra={"XDG_RUNTIME_DIR": str(tmp_path)})
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    return subprocess.run([sys.executable, "-m", "tessera.isolation", "--limit", "8Gi", *flags, "--",
                           "sh", "-c", two_probes_script(native)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


def allocs(out: str) -> list[str]:
    """The answers to the two 5 GiB allocations (third answer of each probe)."""
    answers = [ln for ln in out.splitlines() if ln.startswith("rc=")]
    return sorted(answers[i].split()[0] for i in (2, 5))


def test_processes_of_one_run_share_one_budget(native, tmp_path):
    r = run_cli(native, tmp_path)
    assert r.returncode == 0, r.stderr
    assert allocs(r.stdout) == ["rc=0", "rc=2"]  # 5 + 5 GiB do not fit in one 8 GiB budget
    lines = r.stdout.splitlines()
    region_line = next(ln for ln in lines if ln.startswith("region "))
    assert region_line.split()[1] == "660"  # group-shareable, not world-writable
    assert next(ln for ln in lines if ln.startswith("dir ")) == "dir 750"
    assert not os.path.exists(region_line.split()[2])  # removed when the command ended
    assert not [p for p in os.listdir(tmp_path) if p.startswith("tessera-isolation-")]


def test_per_process_gives_each_its_own_limit(native, tmp_path):
    env_flags = ("--per-process",)
    r = run_cli(native, tmp_path, *env_flags)
    assert r.returncode == 0, r.stderr
    assert allocs(r.stdout) == ["rc=0", "rc=0"]


def test_exit_status_and_signals_pass_through(native, tmp_path):
    env = clean_env(native, preload=False, extra={"XDG_RUNTIME_DIR": str(tmp_path)})
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    r = subprocess.run([sys.executable, "-m", "tessera.isolation", "--limit", "1Gi", "--", "sh", "-c", "exit 7"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 7
    r = subprocess.run([sys.executable, "-m", "tessera.isolation", "--limit", "1Gi", "--", "sh", "-c",
                        "kill -TERM $$"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 128 + 15

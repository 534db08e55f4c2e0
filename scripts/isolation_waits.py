"""Where the isolation bench's 2-thread blocking waits happen (issue 28): runs
native/tests/benchalloc with 2 threads in the shared-region set-up under
``strace -f -k -e trace=futex`` four times and counts each futex call by the three frames above
it (library and function). Used for the attribution in docs/benchmarks.md ("Blocking waits at 2
threads").

    .venv/bin/python scripts/isolation_waits.py [--runs N] [--pairs N]
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import tempfile
from pathlib import Path

from tessera.bench.isolation import _env
from tessera.isolation.build import ensure_built

FRAME = re.compile(r"^\s*>\s+(\S+)")


def waits_by_caller(stderr: str) -> tuple[int, collections.Counter[tuple[str, ...]]]:
    """The futex calls in ``strace -k`` output, and their counts by the 3 frames above libc."""
    calls = 0
    by_caller: collections.Counter[tuple[str, ...]] = collections.Counter()
    stack: list[str] | None = None
    for line in stderr.splitlines():
        if "futex(" in line:
            calls += 1
            stack = []
            continue
        frame = FRAME.match(line)
        if frame and stack is not None:
            stack.append(Path(frame.group(1)).name)
            if len(stack) == 4:
                by_caller[tuple(stack[1:])] += 1
                stack = None
    return calls, by_caller


def main() -> None:
    parser = argparse.ArgumentParser(prog="python scripts/isolation_waits.py")
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=100_000)
    args = parser.parse_args()
    build = ensure_built()
    with tempfile.TemporaryDirectory() as tmp:
        env = _env(build, True, {"TESSERA_GPU_MEMORY_LIMIT": "8Gi",
                                 "TESSERA_GPU_SHARED_REGION": str(Path(tmp) / "region")})
        for run in range(args.runs):
            done = subprocess.run(["strace", "-f", "-k", "-e", "trace=futex",
                                   str(build.program("benchalloc")), str(args.pairs),
                                   str(2**20), "2"], env=env, capture_output=True, text=True,
                                  check=True)
            calls, by_caller = waits_by_caller(done.stderr)
            print(f"run {run}: {calls} futex calls ({done.stdout.strip().split()[-1]})")
            for caller, count in by_caller.most_common(5):
                print(f"    {count:5d}  {' <- '.join(caller)}")


if __name__ == "__main__":
    main()

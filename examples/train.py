"""A stand-in for a training script, for the quickstart: it says which GPU share it got (from
the environment tessera gives every pod) and then "trains" (sleeps) until it is stopped.

    tessera submit frac05 -g 0.5 --interactive -- python examples/train.py
"""

import os
import signal
import sys
import time


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    name = os.environ.get("TESSERA_WORKLOAD_NAME", "train")
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "") or "no GPU"
    limit = os.environ.get("TESSERA_SHARE_LIMIT_BYTES", "")
    share = f"{int(limit.split(',')[0]) / 2**30:.1f} GiB" if limit else "whole device(s)"
    print(f"{name}: training on {devices} with {share} of GPU memory", flush=True)
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else float("inf")
    start = time.monotonic()
    step = 0
    while time.monotonic() - start < seconds:
        time.sleep(1)
        step += 1
        if step % 60 == 0:
            print(f"{name}: step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

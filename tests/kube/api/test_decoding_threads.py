"""Concurrent first decodes do not crash a process that warmed its decoders (tessera.decoding).

msgspec builds a model's decoding information on first use; four threads decoding a Pod list for
the first time at once crash Python (segfault) in most runs (158 of 200 here). This runs that
race in fresh processes after ``tessera.decoding.warm()``, as the API server and tessera-node do
before starting their threads; without the warm-up this test fails (most runs exit -11)."""

from __future__ import annotations

import subprocess
import sys

RACE = r'''
import json, sys, threading
from lightkube.core import decoders
from lightkube.resources.core_v1 import Node, Pod
from tessera import decoding
decoding.warm()
item = json.dumps({"metadata": {"name": "x", "labels": {"a": "b"}, "annotations": {"k": "v"}},
                   "spec": {"containers": [{"name": "c", "image": "i"}]},
                   "status": {"phase": "Running"}})
body = ('{"metadata":{"resourceVersion":"1"},"items":[' + ",".join([item] * 50) + "]}").encode()
models = [Pod, Pod, Pod, Node]
barrier = threading.Barrier(len(models))
def run(model):
    barrier.wait()
    for _ in range(3):
        decoders.decode_list(body, model)
threads = [threading.Thread(target=run, args=(m,)) for m in models]
for t in threads:
    t.start()
for t in threads:
    t.join()
'''


def test_warmed_processes_decode_from_threads_without_crashing() -> None:
    codes = [subprocess.run([sys.executable, "-c", RACE], capture_output=True, timeout=60)
             .returncode for _ in range(12)]
    assert codes == [0] * len(codes), codes

"""The simulated ``nvidia-smi`` (tessera.local.smi) answers what scripts ask of the real one:
``-L``, ``--query-gpu=… --format=csv[,noheader][,nounits]`` (an unknown field refused as
nvidia-smi refuses it), and exits quietly when its reader closes the pipe (``| head``)."""

from __future__ import annotations

import subprocess
import sys

ENV = {"TESSERA_SHARE_UUIDS": "GPU-aaa,GPU-bbb",
       "TESSERA_SHARE_PRODUCTS": "Tesla V100-SXM2-16GB,Tesla V100-SXM2-16GB",
       "TESSERA_SHARE_DEVICE_BYTES": f"{16 * 2**30},{16 * 2**30}",
       "TESSERA_SHARE_LIMIT_BYTES": f"{8 * 2**30},{8 * 2**30}",
       "TESSERA_SHARE_REQUEST_BYTES": f"{4 * 2**30},{8 * 2**30}",
       "TESSERA_WORKLOAD_NAME": "frac05", "TESSERA_PROJECT": "team-a"}


def smi(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tessera.local.smi", *args], env=ENV,
                          capture_output=True, text=True, timeout=60)


def test_list_gpus() -> None:
    r = smi("-L")
    assert r.returncode == 0
    assert r.stdout.splitlines() == ["GPU 0: Tesla V100-SXM2-16GB (UUID: GPU-aaa)",
                                     "GPU 1: Tesla V100-SXM2-16GB (UUID: GPU-bbb)"]


def test_query_gpu_csv() -> None:
    r = smi("--query-gpu=index,name,memory.total,memory.used,uuid", "--format=csv")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "index, name, memory.total [MiB], memory.used [MiB], uuid",
        "0, Tesla V100-SXM2-16GB, 8192 MiB, 0 MiB, GPU-aaa",
        "1, Tesla V100-SXM2-16GB, 8192 MiB, 0 MiB, GPU-bbb"]
    r = smi("--query-gpu", "memory.total,memory.free", "--format", "csv,noheader,nounits")
    assert r.stdout.splitlines() == ["8192, 8192", "8192, 8192"]


def test_bad_queries_are_refused_like_nvidia_smi() -> None:
    r = smi("--query-gpu=bogus", "--format=csv")
    assert r.returncode == 2 and r.stderr.strip() == 'Field "bogus" is not a valid field to query.'
    r = smi("--query-gpu=name")
    assert r.returncode == 2 and '"--format"' in r.stderr


def test_the_table_and_a_closed_pipe() -> None:
    assert "SIMULATED GPU" in smi().stdout
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read(0); "
                             "import time; time.sleep(0.5); "
                             "from tessera.local.smi import main; sys.exit(main(['-L'] * 1))"],
                            env={**ENV, "TESSERA_SHARE_UUIDS": ",".join(f"GPU-{i}" for i in range(5000))},
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line (as `| head -0`)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0
    assert "Traceback" not in err and "BrokenPipe" not in err, err

"""Distributed training in embedded mode: ``tessera training pytorch submit --workers 2`` starts
a gang of two processes with the variables torchrun sets (tessera.local.distributed), and they
really meet at MASTER_ADDR:MASTER_PORT (a TCP rendezvous, as torch.distributed's env:// store
does), each on the GPU share the gang got."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.testing.embedded import EmbeddedServer
from tests.waiting import wait_until

WORKER = r'''
import json, os, socket, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES", "TESSERA_FRAMEWORK", "JAX_PROCESS_ID")
mine = {k: os.environ.get(k) for k in keys}
if rank == 0:
    srv = socket.create_server((addr, port))
    peers = [mine]
    for _ in range(world - 1):
        conn, _ = srv.accept()
        peers.append(json.loads(conn.makefile().readline()))
    open(sys.argv[1], "w").write(json.dumps(peers))
else:
    for _ in range(200):
        try:
            with socket.create_connection((addr, port)) as c:
                c.sendall((json.dumps(mine) + "\n").encode())
            break
        except OSError:
            time.sleep(0.05)
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    s = EmbeddedServer(tmp_path_factory.mktemp("dist"), simulate=["1xV100-16GB"])
    with s.serving("team", gpu="1"):
        yield s


@pytest.mark.parametrize("framework", ["pytorch", "jax"])
def test_workers_meet_at_the_rendezvous_torchrun_sets(server: EmbeddedServer, tmp_path: Path,
                                                      framework: str) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "peers.json"
    server.cli("training", framework, "submit", f"ddp-{framework}", "-p", "team", "-g", "0.5",
               "--workers", "2", "--working-dir", str(tmp_path), "--",
               sys.executable, str(script), str(out))
    wait_until("rank 0 heard every rank", out.exists, timeout=30)
    peers = sorted(json.loads(out.read_text()), key=lambda p: p["RANK"])
    assert [p["RANK"] for p in peers] == ["0", "1"]
    assert [p["LOCAL_RANK"] for p in peers] == ["0", "1"]
    assert {p["WORLD_SIZE"] for p in peers} == {p["LOCAL_WORLD_SIZE"] for p in peers} == {"2"}
    assert {p["MASTER_ADDR"] for p in peers} == {"127.0.0.1"}
    assert len({p["MASTER_PORT"] for p in peers}) == 1
    # Both halves of the one simulated GPU: the same device for both workers.
    assert len({p["CUDA_VISIBLE_DEVICES"] for p in peers}) == 1
    assert peers[0]["CUDA_VISIBLE_DEVICES"]
    assert {p["TESSERA_FRAMEWORK"] for p in peers} == {framework}
    jax_ids = [p["JAX_PROCESS_ID"] for p in peers]
    assert jax_ids == (["0", "1"] if framework == "jax" else [None, None])
    server.cli("training", "delete", f"ddp-{framework}", "-p", "team")


def test_workers_below_one_names_the_flag(server: EmbeddedServer) -> None:
    got = server.cli("training", "pytorch", "submit", "bad", "-p", "team", "-g", "0.5",
                     "--workers", "0", "--", "true", check=False)
    assert got.returncode != 0 and "--workers: must be at least 1 (got 0)" in got.stderr

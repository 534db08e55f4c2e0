"""Distributed workers on one machine: the environment ``torchrun`` gives its processes.

A workload of N workers (``--workers N``, a gang: all start together or none) gets, in each
worker, what ``torchrun --standalone --nproc-per-node N`` would set, so ``torch.distributed``
(``init_process_group("nccl" | "gloo")`` with ``env://``), Accelerate, Lightning and DeepSpeed
start as they do under torchrun:

``MASTER_ADDR`` 127.0.0.1, ``MASTER_PORT`` (a free port drawn when the gang starts, the same for
every worker), ``WORLD_SIZE`` N, ``RANK`` and ``LOCAL_RANK`` the worker's index,
``LOCAL_WORLD_SIZE`` N, ``GROUP_RANK``/``NODE_RANK`` 0, ``ROLE_RANK``, ``ROLE_WORLD_SIZE``,
``TORCHELASTIC_RUN_ID`` the workload id.

Unlike under torchrun, each worker sees only the GPUs the gang gave it (``CUDA_VISIBLE_DEVICES``:
its share's devices), so a script picks its device as ``LOCAL_RANK % torch.cuda.device_count()``
(two workers sharing one GPU at 0.5 each both use ``cuda:0``). docs/workloads.md.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the rendezvous port of one start)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_env(run_id: str, rank: int, world_size: int, master_port: int,
                 framework: str | None = None) -> dict[str, str]:
    """What torchrun sets in worker ``rank`` of ``world_size`` on one node; for
    ``framework="jax"`` also what ``jax.distributed.initialize()`` reads."""
    extra = {}
    if framework == "jax":
        extra = {"JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{master_port}",
                 "JAX_NUM_PROCESSES": str(world_size), "JAX_PROCESS_ID": str(rank)}
    return extra | {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(world_size),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_RANK": "0",
        "NODE_RANK": "0",
        "ROLE_NAME": "default",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world_size),
        "GROUP_WORLD_SIZE": "1",
        "TORCHELASTIC_RUN_ID": run_id,
    }

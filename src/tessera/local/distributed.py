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

An **elastic** workload (``--workers MAX --min-workers MIN``) changes size while it runs, so no
fixed ``WORLD_SIZE``/``RANK`` can be given. Each of its pods is one TorchElastic agent instead:
it gets torchrun's own settings as the ``PET_*`` variables torchrun reads for its options
(``torch.distributed.argparse_util.env``; the ones Kubeflow's PyTorchJob sets for its elastic
policy), so ``torchrun train.py`` in every pod joins one c10d rendezvous and torchrun itself
assigns ``RANK``/``WORLD_SIZE`` to its workers and re-forms the group when a pod comes or goes
(:func:`elastic_env`).
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


ELASTIC_MAX_RESTARTS = "100"
"""``PET_MAX_RESTARTS`` unless the user sets it: torchrun counts a departed member (a pod
shrunk away) as a failure of the remaining workers, which it restarts only while restarts are
left; a member joining costs none."""


def elastic_env(run_id: str, index: int, min_workers: int, workers: int, rendezvous_port: int,
                user: dict[str, str]) -> dict[str, str]:
    """torchrun's options for pod ``index`` of an elastic workload of ``min_workers`` to
    ``workers`` pods (one agent per pod): ``--nnodes MIN:MAX``, ``--rdzv-backend c10d``,
    ``--rdzv-endpoint 127.0.0.1:PORT``, ``--rdzv-id``. Pod 0, which is never shrunk while it
    runs, hosts the rendezvous store (``is_host`` of the c10d backend; the others connect to
    it), so the store outlives every pod that may go. ``user``: the workload's own variables;
    its ``PET_MAX_RESTARTS``, ``PET_NPROC_PER_NODE`` win, its ``PET_RDZV_CONF`` is kept."""
    conf = ",".join(x for x in (user.get("PET_RDZV_CONF", ""), f"is_host={int(index == 0)}") if x)
    return {
        "PET_NNODES": f"{min_workers}:{workers}",
        "PET_NPROC_PER_NODE": user.get("PET_NPROC_PER_NODE", "1"),
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": f"127.0.0.1:{rendezvous_port}",
        "PET_RDZV_ID": run_id,
        "PET_RDZV_CONF": conf,
        "PET_MAX_RESTARTS": user.get("PET_MAX_RESTARTS", ELASTIC_MAX_RESTARTS),
        "TESSERA_MIN_WORKERS": str(min_workers),
    }

"""Running the check under torchrun: this process is one rank, rank 0 reports.

    torchrun --nproc-per-node 2 -m layerlab ddp-check configs/cnn_block.yaml
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --rdzv-endpoint host0:29500 -m layerlab ddp-check …

torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``; when they are set, :func:`layerlab.distributed.run.check_target` calls :func:`run`
instead of starting ranks itself. Every process builds the target (so a bad spec fails everywhere
alike); rank 0 runs the single-process side and sends the job to the others
(``broadcast_object_list``; the single-process records stay on rank 0); every rank runs
:func:`~layerlab.distributed.worker.run_rank`; the results are gathered on rank 0
(``gather_object``), which assembles the report and sends it back, so every process returns it
(and the CLI exits with one code everywhere; only rank 0 prints).
Every collective has the job's timeout; there is no launcher here to stop a hung rank and read its
stack: torchrun's own agent stops the group when a rank exits.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

__all__ = ["TorchrunEnv", "environment", "run"]


@dataclass(frozen=True)
class TorchrunEnv:
    rank: int
    world: int
    local_rank: int
    local_world: int


def environment() -> Optional[TorchrunEnv]:
    """torchrun's variables, or ``None`` when this process was not started as a rank."""
    env = os.environ
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return None
    try:
        world = int(env["WORLD_SIZE"])
        return TorchrunEnv(rank=int(env["RANK"]), world=world, local_rank=int(env.get("LOCAL_RANK", env["RANK"])),
                           local_world=int(env.get("LOCAL_WORLD_SIZE", world)))
    except ValueError:
        return None


def run(env: TorchrunEnv, backend: str, timeout: float, driver: Callable[[], Any],
        finish: Callable[[Any, Any, list], Any]) -> Any:
    """One rank's part of the check under torchrun (module docstring); the report on every rank."""
    import torch.distributed as dist

    from layerlab.distributed.worker import run_rank
    from layerlab.errors import LayerlabError

    from layerlab.distributed.rendezvous import init_group

    init_group(backend, timeout, env.rank, env.world)  # a taken MASTER_PORT: another port or one clear line
    try:
        payload: list = [None]
        single = None
        if env.rank == 0:
            try:
                job, single = driver()  # the single-process runs stay here: only rank 0 reads them
                payload = [("ok", job)]
            except LayerlabError as exc:
                payload = [("error", exc)]
        dist.broadcast_object_list(payload, src=0)
        status, value = payload[0]
        if status == "error":
            raise value
        job = value
        result = run_rank(job, env.rank, env.world, env.local_rank, keep_group=True)
        gathered = [None] * env.world if env.rank == 0 else None
        dist.gather_object(result, gathered, dst=0)
        out: list = [None]
        if env.rank == 0:
            try:  # a shard run a finding asks for can raise: every rank must hear of it, not wait
                out = [("ok", finish(job, single, gathered))]
            except LayerlabError as exc:
                out = [("error", exc)]
        dist.broadcast_object_list(out, src=0)
        status, value = out[0]
        if status == "error":
            raise value
        return value
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()

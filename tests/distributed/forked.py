"""Two real gloo ranks of plain torch, forked from the test process: the truth ddp-check is graded on.

Forked, not spawned: the ranks inherit the imported torch (spawning would import it again, about
10 s on 2 cores), and the models need not be importable by name.
"""

from __future__ import annotations

import datetime
import os
from typing import Any, Callable, Dict, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def _rank(rank: int, store_path: str, out_dir: str, work: Callable[[int], Dict[str, Any]]) -> None:
    torch.set_num_threads(1)  # a forked child must not enter the parent's OpenMP pool (it can deadlock)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, WORLD), rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=20))
    result: Dict[str, Any] = {}
    try:
        result = work(rank)
    finally:
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.destroy_process_group()


def two_ranks(work: Callable[[int], Dict[str, Any]], out_dir: str) -> List[Dict[str, Any]]:
    """``work(rank)`` in each of two forked ranks of one gloo group; their results, rank 0 first.
    A rank still running after 60 s is killed (its result is then what it saved, or missing)."""
    import torch._dynamo  # noqa: F401 - DDP's constructor imports it (seconds): once here, not in every rank

    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_rank, args=(r, os.path.join(out_dir, "store"), out_dir, work))
             for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        if p.is_alive():
            p.kill()
    return [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(WORLD)]

"""One rank of the check: what each process does between ``init_process_group`` and its result.

    init_process_group (env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT — torchrun's variables)
    build the model, load the driver's initial state, broadcast rank 0's (as DDP does)
    take this rank's shard of the batch
    its own step, no DDP          → which parameters it uses, its local gradients, the modules that ran
    monitored_barrier             → a rank stuck in its forward is named by rank 0, not waited for
    all_gather(unused names)      → every rank wraps with the same find_unused_parameters
    [first_step]                  → some unused, the user's False: DDP's first step as the user runs it,
                                    on a copy (gradients after backward; does the next forward raise?)
    DistributedDataParallel step  → the all-reduced gradients, buffers after, inputs/outputs
                                    (find_unused_parameters=True when some parameter got no gradient)
    monitored_barrier
    all_gather(gradient digests)  → a rank whose all-reduced gradients are rank 0's byte for byte sends
                                    none; the driver gives it rank 0's (:func:`shared_grads`)

Every collective has the job's timeout (``init_process_group(timeout=)``; the barriers their own).
On NCCL the barriers and object collectives run on a gloo side group (monitored_barrier is gloo's).
The result is a plain dict of tensors, lists and strings (:func:`as_result`); an exception becomes
``status: raised`` with its last line and the user-code frames. :func:`spawned` is the entry point
for ranks this package starts: it points stdout/stderr at the rank's log and registers a
``faulthandler`` dump on SIGUSR1, so the launcher can say where a hung rank is stuck.
"""

from __future__ import annotations

import os
import time
import traceback
import warnings
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional

from layerlab.distributed.loss import Loss
from layerlab.distributed.options import DdpOptions
from layerlab.distributed.shard import BatchPlan, shard_args
from layerlab.target.bind import Arg

__all__ = ["RankJob", "run_rank", "spawned", "summarize_exception", "user_frames"]


@dataclass
class RankJob:
    """Everything a rank needs, picklable: how to build the model and its initial state, the whole
    batch and how to split it, the loss, DDP's options, the backend and device type."""

    build: Callable[[], Any]
    state: Optional[Dict[str, Any]]
    mode: str
    args: List[Arg]
    plan: BatchPlan
    loss: Loss
    options: DdpOptions
    backend: str
    device: str
    seed: int
    threads: int = 1
    env: Dict[str, str] = field(default_factory=dict)


def run_rank(job: RankJob, rank: int, world: int, local_rank: int, *, keep_group: bool = False) -> Dict[str, Any]:
    """Run this rank's part (see the module docstring); return its result dict."""
    import torch
    import torch.distributed as dist

    from layerlab.distributed.step import one_step

    t0 = time.perf_counter()
    torch.set_num_threads(max(1, job.threads))
    device = torch.device(f"cuda:{local_rank}" if job.device == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=job.options.timeout)
    if not dist.is_initialized():
        dist.init_process_group(job.backend, timeout=timeout, **({"device_id": device} if device.type == "cuda"
                                                                  else {}))
    ctrl = None if job.backend == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    try:
        model = job.build()
        if job.state is not None:
            model.load_state_dict(job.state)
        model.train(job.mode == "train")
        model = model.to(device)
        _broadcast_state(model)
        args = [Arg(a.name, _to(a.value, device), a.keyword, a.no_grad) for a in shard_args(job.args, job.plan, rank)]
        start = {k: v.detach().clone() for k, v in model.state_dict().items()}
        # every buffer, also those left out of the state dict (persistent=False: rotary inv_freq), so that
        # one nobody changes is not taken for one every rank changed
        start_buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
        local = one_step(model, args, job.loss, seed=job.seed, rank=rank, world=world)
        model.load_state_dict(start)  # DDP's step starts where the rank's own step did
        _restore_buffers(model, start_buffers)
        dist.monitored_barrier(group=ctrl, timeout=timeout, wait_all_ranks=True)
        unused = [None] * world
        dist.all_gather_object(unused, sorted(n for n, g in local.grads.items() if g is None), group=ctrl)
        find_unused = job.options.find_unused_parameters or any(unused)
        first, keep = None, None
        if find_unused and not job.options.find_unused_parameters:  # the user's setting cannot finish this step
            first, keep = first_step(model, start, args, job, rank, world, device, unused)
        ddp = _wrap(model, device, find_unused, job.options.broadcast_buffers)
        step = one_step(model, args, job.loss, seed=job.seed, rank=rank, world=world, call=ddp)
        dist.monitored_barrier(group=ctrl, timeout=timeout, wait_all_ranks=True)
        del keep  # the first step's DDP (its reducer may still own buckets in flight) lives until here
        ddp_result = as_result(step)
        digests = [None] * world
        dist.all_gather_object(digests, grads_digest(step.grads), group=ctrl)
        if rank != 0 and digests[rank] == digests[0]:  # byte for byte rank 0's: not sent twice
            ddp_result["grads"], ddp_result["grads_of_rank"] = {}, 0
        return {"rank": rank, "status": "ok", "find_unused_parameters": find_unused, "first_step": first,
                "start_buffers": {k: v.cpu() for k, v in start_buffers.items()},
                "local": as_result(local), "ddp": ddp_result, "seconds": time.perf_counter() - t0,
                "pid": os.getpid()}
    except Exception as exc:
        error, frames = summarize_exception(exc)
        return {"rank": rank, "status": "raised", "error": error, "frames": frames,
                "traceback": "".join(traceback.format_exception(exc))[-4000:], "seconds": time.perf_counter() - t0,
                "pid": os.getpid()}
    finally:
        if not keep_group and dist.is_initialized():
            dist.destroy_process_group()


def _restore_buffers(model: Any, start: Dict[str, Any]) -> None:
    """Put back the buffers ``load_state_dict`` does not (non-persistent ones) as they were at ``start``."""
    import torch

    with torch.no_grad():
        for name, b in model.named_buffers():
            if name in start and b.shape == start[name].shape:
                b.copy_(start[name])


def _wrap(model: Any, device: Any, find_unused: bool, broadcast_buffers: bool) -> Any:
    import torch

    with warnings.catch_warnings():  # torch 2.13 renames it (forward_sync_buffers); users still pass this one
        warnings.filterwarnings("ignore", message=".*broadcast_buffers.*deprecated", category=FutureWarning)
        return torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=find_unused, broadcast_buffers=broadcast_buffers)


def first_step(model: Any, start: Dict[str, Any], args: List[Arg], job: RankJob, rank: int, world: int,
               device: Any, unused: List[List[str]]) -> tuple:
    """DDP's first step with the user's ``find_unused_parameters=False`` although some parameters get no
    gradient: ``(result, the DDP wrapper)``. The result holds the gradients that step leaves after
    backward (``status: measured``) and what the next forward raised (``next_forward``: its last line,
    ``None`` if it did not raise).

    It runs on a copy of the model (its reducer's hooks must not fire in the step that follows), and
    only when every rank skips the same parameters: then every rank marks the same buckets ready and
    launches the same all-reduces. When the ranks skip different ones, their reducers launch different
    collectives, which can pair wrongly or wait forever: ``status: skipped``, nothing run."""
    from layerlab.distributed.step import one_step
    from layerlab.target.copying import copy_model

    if any(u != unused[0] for u in unused):
        return {"status": "skipped", "unused": unused}, None
    twin = copy_model(model)
    twin.load_state_dict(start)
    try:
        ddp = _wrap(twin, device, False, job.options.broadcast_buffers)
        record = one_step(twin, args, job.loss, seed=job.seed, rank=rank, world=world, call=ddp)
    except Exception as exc:
        return {"status": "raised", "error": summarize_exception(exc)[0]}, None
    pos = [a.value for a in args if not a.keyword]
    kw = {a.name: a.value for a in args if a.keyword}
    next_forward = None
    try:  # the second iteration's forward: DDP checks there that the first step's reduction finished
        import torch

        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            ddp(*pos, **kw)
    except Exception as exc:
        next_forward = summarize_exception(exc)[0]
    return {"status": "measured", "grads": record.grads, "next_forward": next_forward, "unused": unused[0]}, ddp


def _broadcast_state(model: Any) -> None:
    """Rank 0's parameters and buffers on every rank (under torchrun each process built its own)."""
    import torch.distributed as dist

    for t in list(model.parameters()) + list(model.buffers()):
        dist.broadcast(t.data, src=0)


def _to(value: Any, device: Any) -> Any:
    from layerlab.target.bind import map_tensors

    if device.type == "cpu":
        return value
    return map_tensors(value, lambda t: t.detach().to(device).requires_grad_(t.requires_grad))


def grads_digest(grads: Dict[str, Any]) -> str:
    """A hash of every gradient's name, dtype, shape and bytes: two ranks with the same digest hold the
    same all-reduced gradients, so only rank 0 sends them (500 MB less per rank for GPT-2)."""
    import hashlib

    import torch

    h = hashlib.blake2b(digest_size=20)
    for name in sorted(grads):
        g = grads[name]
        h.update(f"{name}\0{None if g is None else (g.dtype, tuple(g.shape))}\0".encode())
        if g is not None and g.numel():
            h.update(memoryview(g.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()


def shared_grads(results: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Give back to each rank that sent none the all-reduced gradients it shares with rank 0."""
    for r in results:
        if r.get("status") == "ok" and r["ddp"].get("grads_of_rank") is not None:
            r["ddp"]["grads"] = results[r["ddp"].pop("grads_of_rank")]["ddp"]["grads"]
    return results


def as_result(record: Any) -> Dict[str, Any]:
    """A :class:`~layerlab.distributed.step.StepRecord` as a plain dict (tensors, lists, str)."""
    return {"grads": record.grads, "buffers": record.buffers, "ran": list(record.ran), "loss": record.loss,
            "inputs": [[i.path, i.dtype, i.shape] for i in record.inputs],
            "outputs": [[o.path, o.dtype, o.shape] for o in record.outputs]}


#: frames in these folders are torch's or layerlab's (building a spec runs the model too), not the user's model
_NOT_USER = (os.sep + "torch" + os.sep, os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
             os.sep + "multiprocessing" + os.sep, os.sep + "threading.py", os.sep + "runpy.py", "<string>", "<frozen")


def user_frames(frames: List[traceback.FrameSummary], keep: int = 3) -> List[str]:
    """``file:line in function`` of the innermost user-code frames (the innermost frame if none is)."""
    mine = [f for f in frames if not any(part in f.filename for part in _NOT_USER)]
    real = [f for f in frames if not f.filename.startswith("<")]
    chosen = (mine or real[-1:] or frames[-1:])[-keep:]
    return [f"{_short(f.filename)}:{f.lineno} in {f.name}" for f in chosen]


def _short(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


def summarize_exception(exc: BaseException) -> tuple:
    """``(last line, user frames)`` of an exception: ``RuntimeError: …`` and where it was raised."""
    lines = [ln for ln in traceback.format_exception_only(type(exc), exc)[-1].strip().splitlines() if ln.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text[:400], user_frames(traceback.extract_tb(exc.__traceback__))


def spawned(local_rank: int, job_dir: str, world: int, port: int, log_dir: str) -> None:
    """Entry point of a rank started by :mod:`layerlab.distributed.launch` (``torch.multiprocessing``).

    Sets torchrun's environment variables (so :func:`run_rank` reads what torchrun would give it),
    reads the job the launcher wrote in ``job_dir`` (:mod:`~layerlab.distributed.transport`), sends
    output to ``rank{r}.log`` and the result to ``rank{r}.pt`` in ``log_dir``."""
    import faulthandler
    import signal
    import sys

    log = open(os.path.join(log_dir, f"rank{local_rank}.log"), "w", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    faulthandler.register(signal.SIGUSR1, file=log, all_threads=True)
    os.environ.update({"RANK": str(local_rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       # the launcher hosts the store, as torchrun's agent does: every rank is its client
                       "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0"})
    import torch
    import torch.distributed as dist

    from layerlab.distributed.transport import read_job

    try:
        job = read_job(job_dir)
    except Exception as exc:  # a class the rank cannot import: the driver names the rank and the error
        error, frames = summarize_exception(exc)
        result = {"rank": local_rank, "status": "raised", "error": f"reading the job: {error}", "frames": frames,
                  "traceback": traceback.format_exc()[-4000:], "seconds": 0.0, "pid": os.getpid()}
    else:
        os.environ.update(job.env)
        result = run_rank(job, local_rank, world, local_rank, keep_group=True)
    path = os.path.join(log_dir, f"rank{local_rank}.pt")
    torch.save(result, path + ".part")
    os.replace(path + ".part", path)  # the launcher never reads half a file, and has it before any teardown
    sys.stdout.flush()
    if dist.is_initialized():
        dist.destroy_process_group()
    if result["status"] != "ok":
        sys.exit(1)

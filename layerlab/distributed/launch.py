"""Starting N ranks on this machine and getting every one of them back, whatever they do.

The launcher does what torchrun's agent does, with torch's own pieces:

* the rendezvous store is a ``torch.distributed.TCPStore`` hosted here on 127.0.0.1 with a port
  the OS picks (port 0: no race for a "free" port); ranks join it as clients
  (``TORCHELASTIC_USE_AGENT_STORE``), exactly as under torchrun;
* the job (model, state, batch) is written once into a private temporary folder
  (:mod:`~layerlab.distributed.transport`: one pickle and one file of tensor bytes, never a file
  descriptor per tensor), which is removed when the run ends;
* ranks are ``torch.multiprocessing.start_processes`` processes (a fork server where there is one,
  else ``spawn``) running :func:`layerlab.distributed.worker.spawned`; each reads the job from that
  folder and writes its log and its result file there;
* nothing waits forever. Every collective in a rank has the job's timeout. Here a wall clock
  (:func:`deadline_for`) bounds the whole run; once one rank has failed the others get a short
  grace, then every rank still running is asked for its Python stack (SIGUSR1 → ``faulthandler``)
  and stopped (SIGTERM, then SIGKILL). Ctrl-C stops them the same way.

A rank's outcome is its result dict (``status: ok`` or ``raised``), or one made here: ``hung``
(stopped while running, with where it was) or ``killed`` (it exited without a result: a signal,
``os._exit``, out of memory).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import time
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any, Dict, List, Sequence

from layerlab.distributed.transport import write_job
from layerlab.distributed.worker import RankJob, spawned

__all__ = ["launch", "prestart", "deadline_for", "GRACE_S"]

#: seconds the other ranks get, once one has failed, to finish or fail on their own
GRACE_S = 1.0
#: seconds a spawned rank may take to import torch and reach the rendezvous (2 busy cores: ~2-4 s)
STARTUP_S = 30.0


def deadline_for(timeout: float) -> float:
    """The wall-clock budget of a run whose collectives time out after ``timeout`` seconds: start-up,
    then the rendezvous and the step's few collectives, each of which may wait that long."""
    return STARTUP_S + 4 * timeout


def launch(job: RankJob, world: int) -> List[Dict[str, Any]]:
    """Run ``job`` on ``world`` ranks; one outcome dict per rank, in rank order (see module docstring)."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    log_dir = tempfile.mkdtemp(prefix="layerlab-ddp-")
    store = None
    ctx = None
    try:
        write_job(job, log_dir)  # the ranks read it from there: no descriptor per tensor (transport.py)
        store = dist.TCPStore("127.0.0.1", 0, world, True, wait_for_workers=False,
                              timeout=timedelta(seconds=job.options.timeout))
        ctx = mp.start_processes(spawned, args=(log_dir, world, store.port, log_dir), nprocs=world, join=False,
                                 start_method=_start_method())
        _wait(ctx.processes, log_dir, job.options.timeout)
        return [_outcome(r, p, log_dir) for r, p in enumerate(ctx.processes)]
    finally:
        if ctx is not None:
            _stop([p for p in ctx.processes if p.is_alive()], log_dir, dump=False)
        del store
        shutil.rmtree(log_dir, ignore_errors=True)


#: what the fork server imports once, so each rank starts without importing them again: torch, the
#: rank's code, and torch._dynamo (DistributedDataParallel's constructor imports it: seconds per rank)
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "layerlab.distributed.worker"]


def _start_method(also: Sequence[str] = ()) -> str:
    """``forkserver`` where there is one (Linux, macOS): a clean process that imported :data:`PRELOAD`
    (and ``also``) once forks every rank, in this run and the next ones; ``spawn`` elsewhere. Never
    ``fork``: this process has threads (the store's, torch's) that a forked child would inherit half-way."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    multiprocessing.set_forkserver_preload([*PRELOAD, *also])  # takes effect when the server starts
    return "forkserver"


def prestart(model: Any = None) -> None:
    """Start the fork server now, so its imports (seconds) overlap the caller's own work (building the
    spec, the single-process runs). Harmless where there is none or it is already up.

    ``model`` (a module or a factory): the module that defines its class is imported in the server too
    when it belongs to an installed package this process has imported already (never ``__main__``, a
    script, or anything new): each rank unpickles the model, and a Hugging Face model would otherwise
    import transformers in every rank (seconds each; on a busy machine tens of seconds)."""
    if _start_method(_defining_modules(model)) == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def _defining_modules(model: Any) -> List[str]:
    import sys

    import torch

    if isinstance(model, torch.nn.Module):
        name = type(model).__module__
    elif callable(model):
        name = getattr(model, "__module__", None)
    else:  # a spec path: the rank builds it, from modules the spec names
        return []
    return [name] if name and name != "__main__" and _installed(sys.modules.get(name)) else []


def _installed(module: Any) -> bool:
    """A module of an installed package (site-packages): importing it again in the server is what any
    rank does, without a user script's import-time side effects in a process that outlives the run."""
    import sysconfig

    path = getattr(module, "__file__", None) or ""
    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    return bool(path) and any(os.path.abspath(path).startswith(os.path.abspath(r) + os.sep) for r in roots)


def _wait(procs: List[Any], log_dir: str, timeout: float) -> None:
    """Until every rank has its result (or exited), or one failed (+ grace), or the deadline; then stop
    the rest. A rank that wrote its result and is only tearing down is stopped without a stack dump."""
    end = time.monotonic() + deadline_for(timeout)
    failed_at = done_at = None
    try:
        while True:
            waiting = [r for r, p in enumerate(procs) if p.is_alive() and not _has_result(log_dir, r)]
            if not waiting and done_at is None:
                done_at = time.monotonic()
            now = time.monotonic()
            limit = min(end, failed_at + GRACE_S if failed_at is not None else end,
                        done_at + GRACE_S if done_at is not None else end)
            if not any(p.is_alive() for p in procs) or now >= limit:
                break
            wait([p.sentinel for p in procs if p.is_alive()], timeout=min(0.1, limit - now))
            if failed_at is None and any(p.exitcode not in (None, 0) for p in procs):
                failed_at = time.monotonic()
    except BaseException:  # Ctrl-C, or the command's own time limit: no rank outlives the run
        _stop([p for p in procs if p.is_alive()], log_dir, dump=False)
        raise
    stuck = [p for r, p in enumerate(procs) if p.is_alive() and not _has_result(log_dir, r)]
    _stop(stuck, log_dir, dump=True)
    _stop([p for p in procs if p.is_alive()], log_dir, dump=False)


def _has_result(log_dir: str, rank: int) -> bool:
    return os.path.exists(os.path.join(log_dir, f"rank{rank}.pt"))


def _stop(procs: List[Any], log_dir: str, *, dump: bool) -> None:
    """Stack dump (SIGUSR1 → faulthandler, into the rank's log), then SIGTERM, then SIGKILL."""
    if not procs:
        return
    if dump:
        for p in procs:
            _signal(p, signal.SIGUSR1)
        time.sleep(0.3)  # faulthandler writes from the signal handler: a moment is enough
    for p in procs:
        _signal(p, signal.SIGTERM)
    for p in procs:
        p.join(2.0)
    for p in procs:
        if p.is_alive():
            _signal(p, signal.SIGKILL)
            p.join(2.0)


def _signal(p: Any, sig: int) -> None:
    try:
        os.kill(p.pid, sig)
    except (ProcessLookupError, TypeError):
        pass


def _outcome(rank: int, proc: Any, log_dir: str) -> Dict[str, Any]:
    import torch

    path = os.path.join(log_dir, f"rank{rank}.pt")
    log = _read(os.path.join(log_dir, f"rank{rank}.log"))
    if os.path.exists(path):
        result = torch.load(path, weights_only=True)
        result["log_tail"] = log[-2000:]
        return result
    stack = stack_from_dump(log)
    if stack is not None:
        return {"rank": rank, "status": "hung", "frames": stack, "log_tail": log[-2000:], "pid": proc.pid,
                "error": "still running when stopped" + (f", at {stack[-1]}" if stack else "")}
    code = proc.exitcode
    if not os.path.exists(os.path.join(log_dir, f"rank{rank}.log")):  # it died before spawned() ran
        return {"rank": rank, "status": "killed", "frames": [], "log_tail": "", "pid": proc.pid,
                "error": f"it exited (code {code}) while starting, before layerlab's code ran in it: importing the "
                         "main script in the rank failed (its error is on this process's stderr). A script that "
                         "calls layerlab.ddp_check needs it under if __name__ == '__main__': every rank imports "
                         "the script again"}
    how = (f"killed by signal {signal.Signals(-code).name}" if code is not None and code < 0
           else f"exited with code {code}")
    return {"rank": rank, "status": "killed", "error": f"{how} without a Python exception", "frames": [], "pid": proc.pid,
            "log_tail": log[-2000:]}


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<fn>\S+)')


def stack_from_dump(log: str):
    """The user-code frames of the main thread in a faulthandler dump (innermost last), or ``None``
    when the log holds no dump (the rank was not stopped while running)."""
    import traceback

    from layerlab.distributed.worker import user_frames

    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", log)
    dumps = [b for b in blocks if re.match(r"(?:Current thread|Thread) 0x", b.lstrip())]
    if not dumps:
        return None
    main = next((b for b in dumps if b.lstrip().startswith("Current thread")), dumps[0])
    frames = []
    for line in main.splitlines()[1:]:
        m = _FRAME.match(line)
        if m:
            frames.append(traceback.FrameSummary(m["file"], int(m["line"]), m["fn"]))
    frames.reverse()  # faulthandler lists the most recent call first
    return user_frames(frames)

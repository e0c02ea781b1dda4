"""How long a 2-rank ``layerlab ddp-check`` of configs/cnn_block.yaml takes, cold from the CLI.

    python tests/benchmarks/bench_ddp_check.py              # 3 cold runs
    python tests/benchmarks/bench_ddp_check.py --repeats 5
    python tests/benchmarks/bench_ddp_check.py --gpt2       # GPT-2 124M against a plain DDP step

Prints, measured side by side in this one run:

* **cold CLI**: ``python -m layerlab ddp-check configs/cnn_block.yaml --json`` in a fresh process,
  start to exit — the number the issue bounds (< 15 s). Next to the wall time, the CPU time of the
  *whole process tree* (the CLI, its fork server, both ranks): this process makes itself a child
  subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``), so the fork server, orphaned when the CLI exits,
  is re-parented here, waited for, and counted in ``RUSAGE_CHILDREN``. A process of the tree still
  alive 10 s after the CLI exited is reported as an orphan. The machine is shared: the load
  average before each run says how much of the wall time was waiting for a core.
* **floor**: the same for ``python -c "import torch"`` and ``import torch, torch._dynamo`` — what
  any torch CLI pays, and what a DDP rank must import (DDP's constructor and forward import
  torch._dynamo; the fork server imports it once for every rank);
* **warm**: ``layerlab.ddp_check`` again in this process (fork server up), with its own split
  into the single-process side and the ranks.

``--gpt2`` measures instead, side by side: ``layerlab.ddp_check`` of GPT-2 124M (transformers'
``GPT2Config()`` sizes, built from the config, eval mode, batch 2 × 16 tokens, next-token loss) on
2 ranks, and the same step as a plain script runs it — 2 ranks started with
``torch.multiprocessing`` (spawn), each building the model from the config, ``init_process_group``
(gloo), ``DistributedDataParallel``, one forward + backward on its half of the batch — start to
end, with the step alone next to it. The ratio is what the check costs over one plain DDP step.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = os.path.join(ROOT, "configs", "cnn_block.yaml")
PR_SET_CHILD_SUBREAPER = 36


def _cpu_children() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _reap(limit_s: float = 10.0) -> int:
    """Wait for every re-parented descendant; return how many were still alive after ``limit_s``
    (orphans: reported, and left alone)."""
    end = time.monotonic() + limit_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 0
        if pid == 0:
            if time.monotonic() >= end:
                return len([d for d in os.listdir("/proc") if d.isdigit() and _parent(d) == os.getpid()])
            time.sleep(0.05)


def _parent(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def timed(argv, env=None):
    """``(wall s, tree CPU s, exit code, orphans)`` of one fresh process and all its descendants."""
    before = _cpu_children()
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    orphans = _reap()
    if proc.returncode not in (0, 1):
        sys.exit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return wall, _cpu_children() - before, proc.returncode, orphans


GPT2_BATCH = (2, 16)


def _gpt2():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config()).eval()


def _gpt2_ids():
    import torch

    return torch.randint(0, 50257, GPT2_BATCH, generator=torch.Generator().manual_seed(1))


def _plain_ddp_rank(rank: int, world: int, port: int, out: str) -> None:
    """One rank of a plain DDP script: build, wrap, one step on its half of the batch."""
    import datetime

    import torch
    import torch.distributed as dist

    from tests.distributed.scale_models import lm_loss

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    model = torch.nn.parallel.DistributedDataParallel(_gpt2())
    ids = _gpt2_ids().chunk(world)[rank]
    t0 = time.perf_counter()
    lm_loss(model(input_ids=ids), {"input_ids": ids}).backward()
    step = time.perf_counter() - t0
    if rank == 0:
        with open(out, "w") as f:
            f.write(str(step))
    dist.destroy_process_group()


def gpt2(repeats: int) -> None:
    import socket
    import tempfile

    import torch
    import torch.multiprocessing as mp

    sys.path.insert(0, ROOT)
    import layerlab
    from tests.distributed.scale_models import lm_loss

    rows = []
    for _ in range(repeats):  # interleaved: a burst of load on the shared machine hits both alike
        load = os.getloadavg()[0]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        fd, out = tempfile.mkstemp(prefix="layerlab-bench-")
        os.close(fd)
        t0 = time.perf_counter()
        mp.start_processes(_plain_ddp_rank, args=(2, port, out), nprocs=2, start_method="spawn")
        plain = time.perf_counter() - t0
        with open(out) as f:
            step = float(f.read())
        os.remove(out)
        model, ids = _gpt2(), _gpt2_ids()
        t0 = time.perf_counter()
        report = layerlab.ddp_check(model, input_ids=ids, nproc=2, timeout=120, loss=lm_loss)
        check = time.perf_counter() - t0
        rows.append((check, plain, step, load, report))
    print(f"GPT-2 124M, batch {GPT2_BATCH[0]} × {GPT2_BATCH[1]} tokens, 2 ranks (gloo, CPU), {os.cpu_count()} cores, "
          f"torch {torch.__version__}")
    print(f"  {'ddp_check s':>11s} {'plain DDP script s':>18s} {'its step s':>10s} {'ratio':>6s}  load avg  split")
    for check, plain, step, load, report in rows:
        split = ", ".join(f"{k} {v:.1f}" for k, v in report.seconds.items())
        print(f"  {check:11.1f} {plain:18.1f} {step:10.2f} {check / plain:6.2f}  {load:8.1f}  {split}")
    print(f"  (bound for ddp_check: 60 s; verdict ok={rows[-1][4].ok}, findings: {rows[-1][4].titles()})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gpt2", action="store_true", help="GPT-2 124M against a plain 2-rank DDP step")
    args = parser.parse_args()
    if args.gpt2:
        gpt2(args.repeats)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    subreaper = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0

    py = sys.executable
    floor = {"import torch": [py, "-c", "import torch"],
             "import torch, torch._dynamo": [py, "-c", "import torch, torch._dynamo"]}
    cli = [py, "-m", "layerlab", "ddp-check", SPEC, "--json"]
    rows = {name: [] for name in [*floor, "cold CLI ddp-check"]}
    for _ in range(args.repeats):  # interleaved, so a burst of load on the shared machine hits all alike
        for name, argv in [*floor.items(), ("cold CLI ddp-check", cli)]:
            load = os.getloadavg()[0]
            rows[name].append((*timed(argv), load))

    import torch

    import layerlab

    layerlab.ddp_check(SPEC)  # starts the fork server in this process
    t0 = time.perf_counter()
    report = layerlab.ddp_check(SPEC)
    warm = time.perf_counter() - t0

    print(f"configs/cnn_block.yaml, batch {report.batch}, 2 ranks (gloo, CPU), {os.cpu_count()} cores, "
          f"torch {torch.__version__}; tree CPU counted: {subreaper}")
    print(f"  {'':30s} {'wall s (each run)':>26s} {'median':>7s}  {'tree CPU s':>10s}  load avg")
    for name, runs in rows.items():
        walls = [r[0] for r in runs]
        print(f"  {name:30s} {' '.join(f'{w:5.2f}' for w in walls):>26s} {statistics.median(walls):7.2f}  "
              f"{statistics.median(r[1] for r in runs):10.2f}  {' '.join(f'{r[4]:.1f}' for r in runs)}"
              + (f"  ORPHANS {sum(r[3] for r in runs)}" if any(r[3] for r in runs) else ""))
    print(f"  (bound for the cold CLI: 15 s; exit codes {[r[2] for r in rows['cold CLI ddp-check']]})")
    print(f"  warm ddp_check (fork server up): {warm:.2f} s = single-process side {report.seconds['single']:.2f} s"
          f" + ranks {report.seconds['ranks']:.2f} s + the rest")
    print(f"  verdict: ok={report.ok}, findings: {report.titles()}")


if __name__ == "__main__":
    main()

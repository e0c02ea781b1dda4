"""How long a 2-rank ``layerlab ddp-check`` of configs/cnn_block.yaml takes, next to one process.

    python tests/benchmarks/bench_ddp_check.py

Prints, measured in this one run:

* cold CLI: ``layerlab ddp-check configs/cnn_block.yaml --json`` in a fresh Python process, start to
  exit (imports, the fork server importing torch and torch._dynamo for the ranks, both ranks, the
  report) — the number the issue bounds (< 15 s);
* warm: ``layerlab.ddp_check`` again in this process (the fork server is up: ranks start at once);
* single process: one plain forward + backward of the same model on the whole batch, and
  layerlab's single-process side (whole batch + each shard + the randomness probe).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC = os.path.join(ROOT, "configs", "cnn_block.yaml")


def main() -> None:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "layerlab", "ddp-check", SPEC, "--json"], cwd=ROOT,
                          capture_output=True, text=True)
    cold = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        sys.exit(f"ddp-check failed ({proc.returncode}): {proc.stderr[-2000:]}")

    import torch

    import layerlab
    from layerlab.target.build import from_spec

    layerlab.ddp_check(SPEC)  # starts the fork server in this process
    t0 = time.perf_counter()
    report = layerlab.ddp_check(SPEC)
    warm = time.perf_counter() - t0

    target = from_spec(SPEC, reference=False)
    x = target.args[0].value
    steps = []
    for _ in range(5):
        t0 = time.perf_counter()
        target.module(x).mean().backward()
        steps.append(time.perf_counter() - t0)
    plain = sorted(steps)[2]

    print(f"configs/cnn_block.yaml, batch {report.batch}, 2 ranks (gloo, CPU), {os.cpu_count()} cores, "
          f"torch {torch.__version__}")
    print(f"  cold CLI (fresh process, exit code {proc.returncode}):  {cold:6.2f} s   (bound: 15 s)")
    print(f"  warm ddp_check (fork server up):          {warm:6.2f} s   (ranks {report.seconds['ranks']:.2f} s)")
    print(f"  layerlab's single-process side:           {report.seconds['single']:6.3f} s")
    print(f"  one plain step on the whole batch:        {plain:6.3f} s")
    print(f"  verdict: ok={report.ok}, findings: {report.titles()}")


if __name__ == "__main__":
    main()

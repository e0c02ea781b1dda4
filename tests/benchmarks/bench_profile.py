"""Does `layerlab.profile` account for the whole step, and what does it cost?

On the inspect benchmark's reference CNN and transformer (tests/benchmarks/bench_inspect.py),
prints the whole forward+backward step measured without hooks, the sum of the per-module rows
(target: within 10 % of the step) and the step with the profiler's hooks (its overhead), all
measured in one run by ``layerlab.profile`` itself.

    python tests/benchmarks/bench_profile.py [--repeats 15] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_inspect import make_model  # noqa: E402  (the same reference models)

import layerlab  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    print(f"{'model':<12} {'step ms':>9} {'rows ms':>9} {'rows vs step':>13} {'hooked ms':>10} {'overhead':>9}")
    for name in ("cnn", "transformer"):
        model, x = make_model(name)
        rep = layerlab.profile(model, x, repeats=args.repeats, warmup=3, threads=args.threads)
        step, rows, hooked = _numbers(rep)
        print(f"{name:<12} {step:9.2f} {rows:9.2f} {100 * (rows - step) / step:+12.1f}% {hooked:10.2f}"
              f" {100 * (hooked - step) / step:+8.1f}%")
    return 0


def _numbers(rep):
    t = rep.step
    return t.step_s * 1e3, t.rows_sum_s * 1e3, t.profiled_step_s * 1e3


if __name__ == "__main__":
    sys.exit(main())

"""Start-up benchmark: `layerlab explain-shape` vs `python -c "import torch"` vs `python -c pass`.

Runs the three commands interleaved (round-robin, so drift on a noisy machine hits all of them
alike), takes the median wall time of each, and prints the ratios. Targets (issue #2):
explain-shape within 0.25 s of the bare interpreter, and ≥ 8× faster than importing torch.

    python tests/benchmarks/bench_explain_shape.py [--rounds 15] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time


def _commands() -> dict:
    layerlab = shutil.which("layerlab")
    cli = [layerlab] if layerlab else [sys.executable, "-m", "layerlab"]
    return {
        "explain-shape": cli + ["explain-shape", "--input", "32", "--kernel", "3", "--stride", "2"],
        "import torch": [sys.executable, "-c", "import torch"],
        "python -c pass": [sys.executable, "-c", "pass"],
    }


def measure(rounds: int) -> dict:
    commands = _commands()
    times = {name: [] for name in commands}
    for name, cmd in commands.items():  # warm the file cache once
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    for _ in range(rounds):
        for name, cmd in commands.items():
            start = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(t) for name, t in times.items()}
    return {
        "rounds": rounds,
        "median_s": med,
        "explain_minus_bare_s": med["explain-shape"] - med["python -c pass"],
        "torch_over_explain": med["import torch"] / med["explain-shape"],
        "targets": {"explain_minus_bare_s": "<= 0.25", "torch_over_explain": ">= 8"},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.rounds)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"median wall time over {args.rounds} interleaved rounds:")
    for name, t in result["median_s"].items():
        print(f"  {name:<16} {t * 1000:8.1f} ms")
    ok1 = result["explain_minus_bare_s"] <= 0.25
    ok2 = result["torch_over_explain"] >= 8
    print(f"explain-shape − bare interpreter: {result['explain_minus_bare_s'] * 1000:.1f} ms "
          f"(target ≤ 250 ms) {'OK' if ok1 else 'MISSED'}")
    print(f"import torch / explain-shape:     {result['torch_over_explain']:.1f}× (target ≥ 8×) {'OK' if ok2 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

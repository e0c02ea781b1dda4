"""Cost of the silent-bug check in default ``layerlab.inspect``, side by side with it off.

    python tests/benchmarks/bench_silent.py                       # the four reference models
    python tests/benchmarks/bench_silent.py --models lstm --repeats 21

For each model (those of ``bench_inspect.py``), three variants alternate in one process after a
warm-up: "plain" (forward + backward, as in bench_inspect), "inspect, silent off"
(``layerlab.inspect(model, x, silent=False)``: the code path as it was before the check) and
"inspect" (the default, with the provenance mode around the forward and the findings after it;
the distinct-size re-run only where the real run leaves a coincidence open). Medians of CPU time
and of wall time; ratio = median(variant) / median(plain). CPU time is reported first: on a
shared machine wall time includes waiting for a core. "silent ms" is the median of
``report.timing["silent_s"]`` (the findings and any re-run; the mode's cost is in the forward).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_inspect import Plain, make_model  # noqa: E402  (next to this file)

import layerlab  # noqa: E402


def _clock():
    return time.process_time(), time.perf_counter()


def measure(name: str, repeats: int):
    model, x = make_model(name)
    plain = Plain(model, x)
    variants = {"plain": plain,
                "off": lambda: layerlab.inspect(model, x, silent=False),
                "on": lambda: layerlab.inspect(model, x)}
    for run in variants.values():  # warm-up
        run()
    cpu = {k: [] for k in variants}
    wall = {k: [] for k in variants}
    silent_ms = []
    for _ in range(repeats):
        for key, run in variants.items():
            for p in model.parameters():
                p.grad = None
            c0, w0 = _clock()
            out = run()
            c1, w1 = _clock()
            cpu[key].append(c1 - c0)
            wall[key].append(w1 - w0)
            if key == "on":
                silent_ms.append(1000 * out.timing.get("silent_s", 0.0))
    med = {k: statistics.median(v) for k, v in cpu.items()}
    medw = {k: statistics.median(v) for k, v in wall.items()}
    return med, medw, statistics.median(silent_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", default=["cnn", "transformer", "lstm", "minigpt"])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--threads", type=int, default=1)
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {a.threads} thread(s), {a.repeats} repeats; ratios to plain (CPU time, wall time)")
    print(f"{'model':<12} {'plain ms':>9} {'off ×cpu':>9} {'on ×cpu':>9} {'Δ×cpu':>7} {'off ×wall':>10} {'on ×wall':>9} "
          f"{'silent ms':>10}")
    for name in a.models:
        cpu, wall, silent_ms = measure(name, a.repeats)
        off, on = cpu["off"] / cpu["plain"], cpu["on"] / cpu["plain"]
        print(f"{name:<12} {1000 * cpu['plain']:>9.1f} {off:>9.3f} {on:>9.3f} {on - off:>+7.3f} "
              f"{wall['off'] / wall['plain']:>10.3f} {wall['on'] / wall['plain']:>9.3f} {silent_ms:>10.2f}")


if __name__ == "__main__":
    main()

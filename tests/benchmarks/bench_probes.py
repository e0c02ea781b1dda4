"""Cost of probes: plain forward + backward, ``layerlab.inspect`` and inspect with probes, side by side.

    python tests/benchmarks/bench_probes.py                       # --threads 1, 7 repeats
    python tests/benchmarks/bench_probes.py --repeats 15 --probes attention,sparsity dead,rank

Model: the 6-layer transformer of ``bench_inspect.py`` (nn.TransformerEncoder, d_model 256, 8 heads,
batch_first, train mode, input 8×128×256). "plain" is ``out = model(x)`` then backward with fixed
random output gradients, as in ``bench_inspect.py``; "inspect" is ``layerlab.inspect(model, x)``;
each probe set is ``layerlab.inspect(model, x, probes=[...])``. All variants alternate in one
process after a warm-up, ``.grad`` reset outside what is measured; the median of ``--repeats`` runs
each, and ratios to plain. Target: ``attention,sparsity`` ≤ 1.5× plain.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_inspect import Plain, _reset_grads, make_model  # noqa: E402  (next to this file)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--probes", nargs="*", default=["attention,sparsity", "attention", "sparsity",
                                                          "dead,rank"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import layerlab

    torch.manual_seed(0)
    model, x = make_model("transformer")
    variants = {"plain": Plain(model, x), "inspect": lambda: layerlab.inspect(model, x)}
    for spec in args.probes:
        variants[f"+{spec}"] = (lambda s: lambda: layerlab.inspect(model, x, probes=s.split(",")))(spec)
    times = {name: [] for name in variants}
    for fn in variants.values():  # warm-up
        _reset_grads(model)
        fn()
    for _ in range(args.repeats):
        for name, fn in variants.items():
            _reset_grads(model)
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["plain"])
    print(f"transformer 6×(d 256, 8 heads), input 8×128×256, train, {args.threads} thread(s), "
          f"median of {args.repeats}")
    print(f"{'variant':<28}{'ms':>10}{'× plain':>10}{'× inspect':>11}")
    inspect_ms = statistics.median(times["inspect"])
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"{name:<28}{1e3 * m:>10.1f}{m / base:>10.2f}{m / inspect_ms:>11.2f}")


if __name__ == "__main__":
    main()

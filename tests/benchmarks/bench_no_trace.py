"""Cost of leaving no trace (layerlab.target.no_trace): one snapshot of the model, its inputs and the
process before a command and the restore after it, next to one plain forward + backward and next to
``layerlab.inspect`` itself, on bench_inspect.py's models.

    python tests/benchmarks/bench_no_trace.py                 # cnn, transformer, lstm
    python tests/benchmarks/bench_no_trace.py --models cnn --repeats 30

Printed side by side, medians of ``--repeats`` runs (wall time, one intra-op thread): plain step,
snapshot + restore, their ratio, inspect, and snapshot + restore as a share of inspect. Between the two,
every floating buffer is moved (BatchNorm's statistics, as a train-mode forward moves them), so the
restore has values to put back, and every parameter has a ``.grad`` of the user's to keep.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.bench_inspect import Plain, make_model  # noqa: E402

import layerlab  # noqa: E402
from layerlab.target.no_trace import Snapshot  # noqa: E402


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(name: str, repeats: int) -> dict:
    model, x = make_model(name)
    plain = Plain(model, x)
    plain()  # the user's own .grad tensors, which the restore must give back
    user_grads = {n: p.grad for n, p in model.named_parameters()}

    floats = [b for b in model.buffers() if b.is_floating_point()]

    def snapshot_and_restore():
        snap = Snapshot(model, [x])
        with torch.no_grad():
            for b in floats:  # BatchNorm's statistics moved, as a train-mode forward moves them
                b.add_(1.0)
        snap.restore()

    for fn in (plain, snapshot_and_restore, lambda: layerlab.inspect(model, x)):
        fn()  # warm-up
    step = _median(plain, repeats)
    overhead = _median(snapshot_and_restore, repeats)
    inspect = _median(lambda: layerlab.inspect(model, x), repeats)
    assert all(p.grad is user_grads[n] for n, p in model.named_parameters())
    return {"model": name, "step_ms": step * 1e3, "snap_ms": overhead * 1e3, "snap_vs_step": overhead / step,
            "inspect_ms": inspect * 1e3, "snap_share_of_inspect": overhead / inspect}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["cnn", "transformer", "lstm"])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"{'model':12s} {'plain step':>11s} {'snapshot':>9s} {'÷ step':>7s} {'inspect':>9s} {'÷ inspect':>9s}")
    for name in args.models:
        r = measure(name, args.repeats)
        print(f"{r['model']:12s} {r['step_ms']:9.1f}ms {r['snap_ms']:7.2f}ms {r['snap_vs_step']:6.1%} "
              f"{r['inspect_ms']:7.1f}ms {r['snap_share_of_inspect']:8.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

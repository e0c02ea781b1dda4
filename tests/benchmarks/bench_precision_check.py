"""Cost of ``layerlab.mixed`` next to one plain float32 forward + backward.

    python tests/benchmarks/bench_precision_check.py                 # three configs/ models
    python tests/benchmarks/bench_precision_check.py --repeats 9 --models cnn

Models (the spec files under configs/, built as ``layerlab precision-check`` builds them):

* transformer  configs/transformer_layerlab.yaml (pre-LN encoder block, d 256, 8 heads, 8×128×256)
* cnn          configs/cnn_block.yaml (conv-bn-relu-pool-flatten-linear, 8×3×32×32)
* lstm         configs/lstm.yaml (2-layer LSTM, hidden 64, 4×20×32)
* cnn-b64, lstm-b32 (only when named): the same two specs at batch 64 and 32

One intra-op thread by default (``--threads``): on a shared 2-core machine a second thread's
barrier waits can make a 100k-element reduction take 20 ms instead of 20 µs, which says nothing
about either variant. ``--clock cpu`` times the thread's CPU time instead of wall time: with other
processes on the cores, wall times of a few ms swing by 2× from run to run, CPU times do not.

Columns (medians over ``--repeats``, the variants interleaved in one process after a warm-up):

* fp32      ``out = model(x)``; ``autograd.grad(outs, params, R)`` on the module itself
* autocast  the same step under ``torch.autocast(device, bfloat16)`` (what the check must run once)
* check     ``layerlab.precision_check(spec)`` with its defaults (bf16 autocast on CPU): build
            excluded; both runs with their hooks (in place for torch.nn-only models, else on
            copies; the op trace only where a user-written forward exists), comparison, report
* ratio     check / fp32 (the issue's budget: ≤ 3×), and check / (fp32 + autocast): the check's own
            cost on top of the two steps it cannot avoid (on CPUs without fast bf16 kernels the
            autocast step alone is 2–3× a float32 one)
* floor     (``--floor``) the least any module-by-module comparison costs, with no layerlab code:
            the fp32 step and the autocast step, each with bare torch hooks on every module that
            keep 4096 sampled values of each floating input and output and say whether it is finite
            (a ``sum``), ``aminmax`` of the fp32 run's outputs (float16 overflow), the same for each
            output gradient (a tensor hook), then one stacked ``‖a − b‖ / ‖b‖`` per sample pair
            (see :class:`Floor`). check / floor is layerlab's own cost on top of that.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from layerlab.mixed.check import check_target  # noqa: E402
from layerlab.probe.backward import differentiable_outputs, random_projection  # noqa: E402
from layerlab.target.bind import call  # noqa: E402
from layerlab.target.build import resolve  # noqa: E402

MODELS = {
    "transformer": "configs/transformer_layerlab.yaml",
    "cnn": "configs/cnn_block.yaml",
    "lstm": "configs/lstm.yaml",
}
#: The same two small specs at a larger batch (``--input`` of the CLI): where the check's fixed
#: cost per module call (hooks, sampling, comparison: about 1–2 ms in all) stops dominating.
BATCHED = {
    "cnn-b64": ("configs/cnn_block.yaml", None, [64, 3, 32, 32]),
    "lstm-b32": ("configs/lstm.yaml", "input", [32, 20, 32]),
}


def plain_step(target, autocast: bool) -> None:
    module, args = target.module, target.args
    params = [p for p in module.parameters() if p.requires_grad]
    device = next(module.parameters()).device.type
    ctx = torch.autocast(device, dtype=torch.bfloat16) if autocast else torch.autocast(device, enabled=False)
    with ctx:
        out = call(module, args)
    outs = differentiable_outputs(out)
    grads = [r.to(o.dtype) for r, o in zip(random_projection(outs, target.seed), outs)]
    torch.autograd.grad(outs, params, grad_outputs=grads, allow_unused=True)


class Floor:
    """The two steps with the least work a module-by-module comparison needs (no layerlab code)."""

    SAMPLES = 4096

    def __init__(self, target) -> None:
        self.target = target
        self.positions = {}

    def _keep(self, t, kept, measure):
        flat = t.detach().reshape(-1)
        n = flat.numel()
        if n > self.SAMPLES:
            idx = self.positions.get(n)
            if idx is None:
                idx = self.positions[n] = torch.randint(n, (self.SAMPLES,), generator=torch.Generator().manual_seed(n))
            sample = flat.index_select(0, idx)
        else:
            sample = flat.clone()
        finite = float(flat.sum())
        if measure:
            torch.stack(torch.aminmax(flat)).tolist()
        kept.append((n, sample.float(), finite))

    def _step(self, autocast: bool) -> list:
        kept, handles = [], []
        floating = lambda v: [t for t in (v if isinstance(v, (tuple, list)) else (v,))  # noqa: E731
                              if isinstance(t, torch.Tensor) and t.is_floating_point()]

        def pre(module, args):
            for t in floating(args):
                self._keep(t, kept, False)

        def post(module, args, output):
            outs = output if isinstance(output, (tuple, list)) else (output,)
            flat = [t for o in outs for t in floating(o)]
            for t in flat:
                self._keep(t, kept, not autocast)
                if t.requires_grad:
                    handles.append(t.register_hook(lambda g: self._keep(g, kept, False)))

        for m in self.target.module.modules():
            handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
        try:
            plain_step(self.target, autocast)
        finally:
            for h in handles:
                h.remove()
        return kept

    def __call__(self) -> None:
        ref, half = self._step(False), self._step(True)
        pairs = [(a[1], b[1]) for a, b in zip(half, ref) if a[0] == b[0]]
        by_len = {}
        for a, b in pairs:
            by_len.setdefault(a.numel(), []).append((a, b))
        for group in by_len.values():
            x = torch.stack([a for a, _ in group]).double()
            y = torch.stack([b for _, b in group]).double()
            (torch.linalg.vector_norm(x - y, dim=1) / torch.linalg.vector_norm(y, dim=1)).tolist()


CLOCK = time.perf_counter


def timed(fn) -> float:
    start = CLOCK()
    fn()
    return CLOCK() - start


def bench(name: str, repeats: int, warmup: int, floor: bool = False) -> dict:
    if name in BATCHED:
        from layerlab.spec.validate import Overrides

        path, arg, shape = BATCHED[name]
        target = resolve(os.path.join(ROOT, path), overrides=Overrides(input_shapes=[(arg, shape)]), reference=False)
    else:
        target = resolve(os.path.join(ROOT, MODELS[name]), reference=False)
    variants = {
        "fp32": lambda: plain_step(target, autocast=False),
        "autocast": lambda: plain_step(target, autocast=True),
        "check": lambda: check_target(target),
    }
    if floor:
        variants["floor"] = Floor(target)
    for _ in range(warmup):
        for fn in variants.values():
            fn()
    times = {k: [] for k in variants}
    for i in range(repeats):
        order = list(variants) if i % 2 == 0 else list(reversed(variants))
        for k in order:
            times[k].append(timed(variants[k]))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"model": name, **med, "ratio": med["check"] / med["fp32"],
            "own": med["check"] / (med["fp32"] + med["autocast"]),
            "floor_ratio": med["floor"] / med["fp32"] if floor else None,
            "over_floor": med["check"] / med["floor"] if floor else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=[*MODELS, *BATCHED],
                        help=f"default: {' '.join(MODELS)}; also {' '.join(BATCHED)} (the small specs at a larger batch)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1, see above)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="cpu: this thread's CPU time (time.thread_time; with --threads 1 every kernel runs on "
                             "it), steadier than wall time when other processes share the cores")
    parser.add_argument("--floor", action="store_true",
                        help="also time the floor (the two steps with bare hooks doing the least work, see above)")
    ns = parser.parse_args()
    global CLOCK
    CLOCK = time.thread_time if ns.clock == "cpu" else time.perf_counter
    if ns.clock == "cpu" and ns.threads != 1:
        parser.error("--clock cpu measures one thread: use it with --threads 1")
    torch.set_num_threads(ns.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {ns.clock} clock, medians of {ns.repeats}")
    print(f"{'model':<12} {'fp32 ms':>9} {'autocast ms':>12} {'check ms':>9} {'check/fp32':>11} "
          f"{'check/(fp32+autocast)':>22}" + (f" {'floor/fp32':>11} {'check/floor':>12}" if ns.floor else ""))
    for name in ns.models:
        r = bench(name, ns.repeats, ns.warmup, ns.floor)
        line = (f"{r['model']:<12} {r['fp32'] * 1e3:>9.1f} {r['autocast'] * 1e3:>12.1f} {r['check'] * 1e3:>9.1f} "
                f"{r['ratio']:>10.2f}× {r['own']:>21.2f}×")
        if ns.floor:
            line += f" {r['floor_ratio']:>10.2f}× {r['over_floor']:>11.2f}×"
        print(line)


if __name__ == "__main__":
    main()

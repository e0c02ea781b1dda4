"""Speed of layerlab's reference layers next to their torch.nn counterparts (forward + backward).

For every registry entry with a torch reference, build layerlab's layer from the entry's
default args (or an override below), take its torch twin with the same weights from
``layer.to_torch()`` (or ``from_torch`` of the reference), and time forward + backward of both in
this one process: warm-up first, then ``--repeats`` rounds of interleaved single calls (ours,
torch, torch, ours, …); the table shows the median time per call over all rounds.

    python tests/benchmarks/bench_layers.py [--layers conv2d,lstm] [--repeats 15] [--threads 1] [--json]

The layer and its twin see the same inputs, output gradients and thread count (default 1).

Targets (CPU): functional-op layers (conv, linear, patch embedding, attention via explicit
matmuls) ≤ 1.15× torch. Teaching variants (im2col, explicit pooling, adaptive bins) and
recurrent stacks are reported as they are, with no target.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from layerlab.registry import REGISTRY, LayerEntry

#: Benchmark configs that differ from the registry defaults. ``lstm`` is fixed by the issue
#: (16×50×64, hidden 128, 2 layers); the attention layers get a realistic size too, since at the
#: registry's tiny defaults the timing is mostly Python call overhead. ``args`` are merged into the
#: entry's, ``inputs`` replace them.
_SELF_ATTN = {"query": {"shape": [16, 128, 256]}, "key": {"same_as": "query"}, "value": {"same_as": "query"},
              "attn_mask": {"causal": 128}}
OVERRIDES: Dict[str, Dict[str, Any]] = {
    "lstm": {"args": {"input_size": 64, "hidden_size": 128, "num_layers": 2},
             "inputs": {"input": {"shape": [16, 50, 64]}}},
    "multihead_attention": {"args": {"embed_dim": 256, "num_heads": 8}, "inputs": _SELF_ATTN},
    "scaled_dot_product_attention": {"inputs": {
        "query": {"shape": [16, 8, 128, 32]}, "key": {"same_as": "query"}, "value": {"same_as": "query"},
        "attn_mask": {"causal": 128}}},
}

#: Entries without a registry reference whose ``to_torch()`` is still an exact torch twin.
TWIN_ONLY = {"separable_conv2d"}

#: Torch-side output adapters, so both sides compute the same output: patch_embedding's twin is
#: the bare nn.Conv2d, and the layer also returns the map as one row per patch.
TORCH_OUTPUT = {
    "patch_embedding": lambda y: y.flatten(-2).transpose(-2, -1),  # (N, D, H', W') → (N, L, D)
}

#: Layers held to the ≤ 1.15× target: those that end in the same functional op as torch.
#: scaled_dot_product_attention is the explicit five-op teaching form against torch's fused
#: kernel: reported, not targeted (the issue targets multi-head attention via explicit matmuls).
TARGETED = {
    "conv1d", "conv2d", "conv3d", "separable_conv2d", "linear", "patch_embedding", "multihead_attention",
}
TARGET = 1.15
#: The issue's own bound for the recurrent stack: LSTM (16×50×64, hidden 128, 2 layers) ≤ 3×.
SPECIAL_TARGETS = {"lstm": 3.0}


@dataclass
class Row:
    layer: str
    shape: str
    layerlab_ms: float
    torch_ms: float
    ratio: float
    target: Optional[float]
    max_abs_diff: Optional[float]


def make_inputs(spec: Dict[str, Dict[str, Any]], seed: int = 0) -> Dict[str, torch.Tensor]:
    """Inputs from a spec's ``inputs:`` mapping (shape/dtype/low/high, same_as, causal)."""
    g = torch.Generator().manual_seed(seed)
    out: Dict[str, torch.Tensor] = {}
    for name, item in spec.items():
        if "same_as" in item:
            out[name] = out[item["same_as"]]
        elif "causal" in item:
            t = item["causal"]
            out[name] = torch.full((t, t), float("-inf")).triu(1)  # 0 on/below the diagonal, −inf above
        else:
            dtype = getattr(torch, item.get("dtype", "float32"))
            if dtype.is_floating_point:
                out[name] = torch.randn(item["shape"], generator=g, dtype=dtype).requires_grad_(True)
            else:
                out[name] = torch.randint(item.get("low", 0), item["high"], item["shape"], generator=g, dtype=dtype)
    return out


def build_pair(entry: LayerEntry, args: Dict[str, Any]) -> Tuple[torch.nn.Module, torch.nn.Module]:
    cls = entry.load()
    if hasattr(cls, "to_torch"):
        ours = cls(**args)
        return ours, ours.to_torch()
    ref = entry.load_reference()(**args)
    return cls.from_torch(ref), ref


def _tensors(obj) -> List[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in _tensors(item)]
    return []


class Step:
    """One forward + backward of ``module`` on fixed inputs, with fixed output gradients."""

    def __init__(self, module: torch.nn.Module, inputs: Dict[str, torch.Tensor],
                 output: Callable[[Any], Any] = lambda y: y, seed: int = 1) -> None:
        self.module, self.inputs, self.output = module, inputs, output
        self.leaves = [t for t in inputs.values() if t.requires_grad] + list(module.parameters())
        outs = [t for t in _tensors(self.forward()) if t.requires_grad]
        g = torch.Generator().manual_seed(seed)
        self.grads = [torch.randn(t.shape, generator=g, dtype=t.dtype) for t in outs]

    def forward(self):
        return self.output(self.module(**self.inputs))

    def __call__(self) -> None:
        outs = [t for t in _tensors(self.forward()) if t.requires_grad]
        torch.autograd.backward(outs, self.grads)

    def clear(self) -> None:
        for t in self.leaves:
            t.grad = None


def _one(step: Step) -> float:
    step.clear()  # outside the timed region: both sides start from empty .grad
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def measure(entry: LayerEntry, repeats: int, min_round_s: float = 0.05) -> Row:
    override = OVERRIDES.get(entry.name, {})
    args = {**entry.args, **override.get("args", {})}
    spec = override.get("inputs", entry.inputs)
    torch.manual_seed(0)
    ours, ref = build_pair(entry, args)
    inputs = make_inputs(spec)
    steps = {"ours": Step(ours, inputs), "torch": Step(ref, inputs, TORCH_OUTPUT.get(entry.name, lambda y: y))}
    diff = None
    if "stochastic" not in entry.tags:  # a sanity check that the twins agree (the tests do it properly)
        with torch.no_grad():
            a, b = _tensors(steps["ours"].forward())[0], _tensors(steps["torch"].forward())[0]
            diff = (a - b).abs().max().item() if a.shape == b.shape else None
    for _ in range(3):  # warm-up (allocator, lazy init, caches)
        _one(steps["ours"]), _one(steps["torch"])
    per_pair = _one(steps["ours"]) + _one(steps["torch"])
    calls = max(1, int(min_round_s / per_pair))  # pairs of calls per round
    # Interleave call by call, alternating which side goes first, and keep every single timing:
    # on a shared machine a preempted call is an outlier that the median ignores, and slow drift
    # hits both sides alike.
    times: Dict[str, List[float]] = {"ours": [], "torch": []}
    for r in range(repeats):
        for i in range(calls):
            order = ("ours", "torch") if (r + i) % 2 == 0 else ("torch", "ours")
            for name in order:
                times[name].append(_one(steps[name]))
    ours_ms = statistics.median(times["ours"]) * 1e3
    torch_ms = statistics.median(times["torch"]) * 1e3
    distinct = {id(t): t for t in inputs.values() if t.requires_grad}.values()  # same_as inputs once
    shape = " ".join("×".join(map(str, t.shape)) for t in distinct)
    return Row(entry.name, shape, round(ours_ms, 4), round(torch_ms, 4), round(ours_ms / torch_ms, 3),
               TARGET if entry.name in TARGETED else SPECIAL_TARGETS.get(entry.name), diff)


def selected(names: Optional[str]) -> List[LayerEntry]:
    entries = [e for e in REGISTRY.values() if e.reference is not None or e.name in TWIN_ONLY]
    if not names:
        return entries
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in {e.name for e in entries}]
    if unknown:
        raise SystemExit(f"bench_layers: no benchmarkable layer {unknown}; choose from "
                         + ", ".join(e.name for e in entries))
    return [e for e in entries if e.name in wanted]


def render(rows: List[Row], threads: int, repeats: int) -> str:
    head = (f"{'layer':<30} {'input shape':<18} {'layerlab ms':>11} {'torch ms':>9} {'ratio':>6}  "
            f"{'max |Δ|':>8}  target")
    lines = [f"forward + backward, median per call over {repeats} rounds of interleaved calls, "
             f"{threads} thread(s), torch {torch.__version__}", head, "-" * len(head)]
    for r in rows:
        verdict = "-" if r.target is None else (f"≤{r.target} ok" if r.ratio <= r.target else f"≤{r.target} MISS")
        diff = "-" if r.max_abs_diff is None else f"{r.max_abs_diff:.1e}"
        lines.append(f"{r.layer:<30} {r.shape:<18} {r.layerlab_ms:>11.3f} {r.torch_ms:>9.3f} {r.ratio:>6.2f}  "
                     f"{diff:>8}  {verdict}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", help="comma-separated registry names (default: all with a reference)")
    parser.add_argument("--repeats", type=int, default=15)
    # One thread by default: on a busy machine intra-op threads wait for each other whenever one is
    # descheduled (seen: 2 threads, 0.27 ms → 170 ms per conv call), which measures the machine.
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads; 0: torch's default")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for entry in selected(args.layers):
        rows.append(measure(entry, args.repeats))
        if not args.json:
            print(f"  measured {entry.name}", file=sys.stderr)
    if args.json:
        print(json.dumps({"threads": torch.get_num_threads(), "repeats": args.repeats, "torch": torch.__version__,
                          "rows": [asdict(r) for r in rows]}, indent=2, ensure_ascii=False))
    else:
        print(render(rows, torch.get_num_threads(), args.repeats))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

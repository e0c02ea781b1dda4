"""Cost of ``layerlab.inspect`` next to a plain forward + backward, on three reference models.

    python tests/benchmarks/bench_inspect.py            # all three, default repeats
    python tests/benchmarks/bench_inspect.py --repeats 30 --models cnn lstm
    python tests/benchmarks/bench_inspect.py --models cnn --floor --mem-repeats 0 --no-meta

Models (train mode, float32, CPU unless --device):

* cnn          3 conv-bn-relu stages + pool + linear, input 16×3×64×64
* transformer  nn.TransformerEncoder, 6 layers, d_model 256, 8 heads, batch_first, input 8×128×256
* lstm         nn.LSTM, 2 layers, hidden 128, batch_first, input 16×50×64
* resnet18, mobilenet, gpt2: models of real size (ResNet-18 at 4×3×224×224, MobileNetV3-small at
               8×3×224×224, GPT-2 small at 1×128 token ids), built in ``scale_models.py`` from torch.nn
               or a transformers config (no downloads); targets ≤ 1.2× (ResNet-18, GPT-2) and ≤ 1.5×
               (MobileNet, whose many small modules make a fixed cost per call show)
* minigpt      4 hand-written pre-LN GPT blocks (d 256, 8 heads, its own q/k/v split, view,
               transpose, q @ kᵀ, masked_fill, softmax in the model's code), input 8×128×256: the
               three above are torch.nn modules, whose internal ops ``--ops`` does not record, so
               this one measures the op trace where it has work to do

"floor" (``--floor``) is plain plus bare torch hooks that take the default report's numbers at
the least cost and nothing else (see ``Floor``): floor ÷ plain is what the statistics themselves
cost, and inspect ÷ floor is layerlab's own cost on top (bookkeeping, formula checks, report).

"inspect --ops" is ``layerlab.inspect(model, x, ops=True)``: the same, plus the op trace
(:mod:`layerlab.probe.ops`). Its time is measured in the same interleaved loop (target ≤ 2×), on
the four small models only unless ``--ops`` is given (``—`` otherwise).

"plain" is ``out = model(x)`` then ``torch.autograd.backward(outs, grads)`` with fixed random
output gradients (the same loss ``⟨out, R⟩`` inspect differentiates). Before every run of either
variant, outside what is measured, every ``.grad`` is set to None (so plain's backward allocates
its gradients as inspect's ``autograd.grad`` does, and neither run starts with the other's). "inspect" is ``layerlab.inspect(model, x)`` with its defaults (statistics, backward,
formula checks, report assembly — the whole call).

Time: both variants alternate in one process (warm-up first), the median of ``--repeats`` runs
each, ratio = median(inspect) / median(plain). Wall time and CPU time of the process are both
reported: on a shared machine wall time includes waiting for a core, CPU time does not (with one
intra-op thread it is the work done; with more it also counts threads spinning at barriers).

Memory: tracemalloc does not see torch's CPU allocations, so each model runs in a fresh
subprocess with ``MALLOC_MMAP_THRESHOLD_=65536`` (every tensor-sized block is its own mmap and
goes back to the OS when freed, so resident memory follows live tensor bytes). After a warm-up of
both variants, the kernel's peak-RSS counter is reset (``/proc/self/clear_refs``), one variant
runs, and peak − baseline RSS is its peak extra memory. Medians over ``--mem-repeats``; ratio =
inspect / plain. On CUDA the same is done with ``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scale_models  # noqa: E402  (next to this file)

#: Measured with ``--ops`` by default (the scale models only when asked: the trace is not their point).
OPS_MODELS = ("cnn", "transformer", "lstm", "minigpt")


def make_model(name: str):
    if name == "cnn":
        def stage(cin, cout):
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2)]

        model = nn.Sequential(*stage(3, 32), *stage(32, 64), *stage(64, 128),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
        x = torch.randn(16, 3, 64, 64)
    elif name == "transformer":
        layer = nn.TransformerEncoderLayer(d_model=256, nhead=8, batch_first=True)
        model = nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False)
        x = torch.randn(8, 128, 256)
    elif name == "lstm":
        model = nn.LSTM(64, 128, num_layers=2, batch_first=True)
        x = torch.randn(16, 50, 64)
    elif name == "minigpt":
        model = nn.Sequential(*[GPTBlock(256, 8) for _ in range(4)])
        x = torch.randn(8, 128, 256)
    else:
        return scale_models.make(name)
    return model.train(), x


class GPTBlock(nn.Module):
    """A pre-LN transformer block written as users write them (ops in the model's own code)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / (C // self.heads) ** 0.5)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):  # a transformers ModelOutput
        return [t for o in out.values() for t in _flat(o)]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return []


class Plain:
    """Forward + backward with fixed output gradients."""

    def __init__(self, model, x):
        self.model, self.x = model, x
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            outs = _flat(model(x))
        self.grads = [torch.randn(o.shape, generator=gen).to(o.device, o.dtype) for o in outs]

    def __call__(self):
        outs = _flat(self.model(self.x))
        torch.autograd.backward(outs, self.grads)


class Floor(Plain):
    """Plain, plus what the default report's numbers cost at the least, with no layerlab code:
    torch hooks on every module that take, once per distinct floating output, its sum, ‖x‖ (a
    ``dot``), min and max (one ``aminmax``) and its count of non-zeros (``count_nonzero`` of the
    integer bits), and ‖g‖ of each output's gradient (a ``dot``). inspect ÷ floor is layerlab's own
    cost beyond these reductions (hooks' bookkeeping, formula checks, the report)."""

    def __call__(self):
        seen, handles = set(), []

        def post(module, args, output):
            for t in _flat(output):
                if not t.is_floating_point() or id(t) in seen:
                    continue
                seen.add(id(t))
                flat = t.detach().reshape(-1)
                float(flat.sum()), float(torch.dot(flat, flat))
                torch.stack(torch.aminmax(flat)).tolist()
                int(torch.count_nonzero(flat.view(torch.int32)))
                if t.requires_grad:
                    handles.append(t.register_hook(_grad_norm))

        handles += [m.register_forward_hook(post) for m in self.model.modules()]
        try:
            super().__call__()
        finally:
            for h in handles:
                h.remove()


def _grad_norm(g) -> None:
    flat = g.reshape(-1)
    float(torch.dot(flat, flat))


def run_inspect(model, x, ops: bool = False):
    import layerlab

    return layerlab.inspect(model, x, ops=ops)


def _reset_grads(model) -> None:
    for p in model.parameters():
        p.grad = None


def _sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_model(name: str, repeats: int, device: str, ops: bool = True, floor: bool = False) -> dict:
    torch.manual_seed(0)
    model, x = make_model(name)
    model, x = model.to(device), x.to(device)
    plain = Plain(model, x)
    variants = {"plain": plain, "inspect": lambda: run_inspect(model, x)}
    if floor:
        variants["floor"] = Floor(model, x)
    if ops:
        variants["ops"] = lambda: run_inspect(model, x, ops=True)
    for fn in variants.values():  # warm-up: allocator, oneDNN primitives, autograd threads
        for _ in range(2):
            fn()
    times = {k: [] for k in variants}
    cpu = {k: [] for k in variants}
    for r in range(repeats):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for key in order:
            _reset_grads(model)
            _sync(device)
            start, start_cpu = time.perf_counter(), time.process_time()
            variants[key]()
            _sync(device)
            times[key].append(time.perf_counter() - start)
            cpu[key].append(time.process_time() - start_cpu)
    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    nan = float("nan")
    return {"plain_s": med["plain"], "inspect_s": med["inspect"], "time_ratio": med["inspect"] / med["plain"],
            "cpu_ratio": med_cpu["inspect"] / med_cpu["plain"], "ops_s": med.get("ops", nan),
            "ops_ratio": med.get("ops", nan) / med["plain"], "floor_ratio": med.get("floor", nan) / med["plain"],
            "over_floor": med["inspect"] / med.get("floor", nan)}


# -- memory (run in a fresh subprocess) ---------------------------------------------------------
def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(key)


def _peak_extra(fn, device: str) -> int:
    import gc

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    base = _status("VmRSS")
    fn()
    return _status("VmHWM") - base


def memory_child(name: str, repeats: int, device: str) -> dict:
    import layerlab.probe.run  # noqa: F401  (imports are not per-run memory)
    import layerlab.probe.assemble  # noqa: F401

    torch.manual_seed(0)
    model, x = make_model(name)
    model, x = model.to(device), x.to(device)
    plain = Plain(model, x)
    variants = {"plain": plain, "inspect": lambda: run_inspect(model, x)}
    for fn in variants.values():
        for _ in range(2):
            fn()
    peaks = {k: [] for k in variants}
    for r in range(repeats):
        for key in (variants if r % 2 == 0 else reversed(list(variants))):
            _reset_grads(model)
            peaks[key].append(_peak_extra(variants[key], device))
    med = {k: statistics.median(v) for k, v in peaks.items()}
    return {"plain_bytes": med["plain"], "inspect_bytes": med["inspect"],
            "mem_ratio": med["inspect"] / med["plain"] if med["plain"] else float("nan")}


def memory_model(name: str, repeats: int, device: str) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    cmd = [sys.executable, __file__, "--child", name, "--mem-repeats", str(repeats), "--device", device,
           "--threads", str(torch.get_num_threads())]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- inspect --meta of a 7B model (a fresh subprocess: its peak RSS is the whole run's) -----------
_META_7B = """
import resource, time
start = time.perf_counter()
import torch, layerlab
from transformers import LlamaConfig, LlamaForCausalLM
config = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=32, vocab_size=32000)
with torch.device("meta"):
    model = LlamaForCausalLM(config)
built = time.perf_counter()
report = layerlab.inspect(model, torch.randint(0, 32000, (1, 2048)), meta=True)
done = time.perf_counter()
assert report.ok, report.failure
# VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork+exec, so it would report this
# benchmark's own peak (the models timed above), not the child's
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(done - start, done - built, hwm * 1024, report.total_params,
      len(report.calls), report.memory.activation_bytes)
"""


def meta_7b() -> str:
    """One line: ``inspect --meta`` of a Llama-style 7B config built on meta (targets < 30 s, < 2 GB)."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return "meta 7B: skipped (transformers is not installed)"
    out = subprocess.run([sys.executable, "-c", _META_7B], capture_output=True, text=True)
    if out.returncode:
        return "meta 7B: FAILED\n" + out.stderr[-2000:]
    total, run, rss, params, calls, act = out.stdout.split()
    return (f"meta 7B (Llama, 32 layers, d 4096, 1×2048 tokens): {int(params) / 1e9:.2f} B parameters, {calls} calls, "
            f"activations {int(act) / 2**30:.1f} GiB estimated; inspect {float(run):.1f} s, whole process "
            f"{float(total):.1f} s with imports, peak RSS {int(rss) / 2**30:.2f} GiB  (targets < 30 s, < 2 GB)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*",
                        default=["cnn", "transformer", "lstm", "minigpt", "resnet18", "mobilenet", "gpt2"])
    parser.add_argument("--no-meta", action="store_true", help="skip the inspect --meta 7B line")
    parser.add_argument("--ops", action="store_true", help="time --ops on every model (default: the small four)")
    parser.add_argument("--floor", action="store_true",
                        help="also time the floor: plain + bare torch hooks taking the report's reductions (see Floor)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--mem-repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(memory_child(args.child, args.mem_repeats, args.device)))
        return 0
    print(f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} threads, "
          f"{args.repeats} timed repeats, {args.mem_repeats} memory repeats")
    header = (f"{'model':<12} {'plain ms':>9} {'inspect ms':>11} {'time ×':>7} {'cpu ×':>6} "
              f"{'--ops ms':>9} {'--ops ×':>8} {'plain MB':>9} {'inspect MB':>11} {'mem ×':>6}")
    print(header)
    print("-" * len(header))
    for name in args.models:
        t = time_model(name, args.repeats, args.device, ops=args.ops or name in OPS_MODELS, floor=args.floor)
        ops = (f"{1e3 * t['ops_s']:9.1f} {t['ops_ratio']:8.3f}" if t["ops_s"] == t["ops_s"]
               else f"{'—':>9} {'—':>8}")
        if args.mem_repeats:
            m = memory_model(name, args.mem_repeats, args.device)
            mem = f"{m['plain_bytes'] / 2**20:9.1f} {m['inspect_bytes'] / 2**20:11.1f} {m['mem_ratio']:6.3f}"
        else:
            mem = f"{'—':>9} {'—':>11} {'—':>6}"
        print(f"{name:<12} {1e3 * t['plain_s']:9.1f} {1e3 * t['inspect_s']:11.1f} {t['time_ratio']:7.3f} "
              f"{t['cpu_ratio']:6.3f} {ops} {mem}", flush=True)
        if args.floor:
            print(f"{'':<12} floor (plain + the reductions alone) {t['floor_ratio']:.3f} × plain; "
                  f"inspect {t['over_floor']:.3f} × floor", flush=True)
    print("targets: time × ≤ 1.2 (mobilenet ≤ 1.5), --ops × ≤ 2, mem × ≤ 1.1")
    if not args.no_meta:
        print(meta_7b(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

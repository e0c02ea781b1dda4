"""Benchmark: `layerlab gradcheck --all` wall time (issue #5 target: under 2 minutes on CPU), and
`--model gpt2`: the gradcheck and the whole `verify` of a 124M-parameter model (issue #10: under
a minute), next to one plain forward+backward of it.

Runs each measurement in a fresh process (start-up, imports included; peak RSS is that process's),
prints the median wall time, the slowest layers and the slowest checks from its JSON.

    python tests/benchmarks/bench_gradcheck.py [--rounds 3] [--deep] [--json]
    python tests/benchmarks/bench_gradcheck.py --model gpt2|vit [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time

TARGET_S = 120.0


def measure(rounds: int, deep: bool) -> dict:
    layerlab = shutil.which("layerlab")
    cmd = ([layerlab] if layerlab else [sys.executable, "-m", "layerlab"]) + ["gradcheck", "--all", "--json"]
    if deep:
        cmd += ["--deep", "--compile-backend", "aot_eager"]
    walls, last = [], None
    for _ in range(rounds):
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        walls.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise SystemExit(f"gradcheck --all exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        last = json.loads(done.stdout)
    layers = sorted(((r["target"], r["seconds"]) for r in last["reports"]), key=lambda x: -x[1])
    checks: dict = {}
    for r in last["reports"]:
        for c in r["checks"]:
            checks[c["name"]] = checks.get(c["name"], 0.0) + c["seconds"]
    return {
        "command": " ".join(cmd[1:]),
        "rounds": rounds,
        "wall_s": [round(w, 2) for w in walls],
        "median_wall_s": round(statistics.median(walls), 2),
        "checks_s": round(last["seconds"], 2),
        "layers": len(last["reports"]),
        "slowest_layers": [(n, round(s, 2)) for n, s in layers[:5]],
        "seconds_per_check": {k: round(v, 2) for k, v in sorted(checks.items(), key=lambda kv: -kv[1])},
        "target_s": TARGET_S,
        "ok": statistics.median(walls) < TARGET_S,
    }


MODEL_TARGET_S = 60.0

_CHILD = r"""
import json, resource, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
what = sys.argv[1]
which = sys.argv[2] if len(sys.argv) > 2 else "gpt2"
torch.manual_seed(0)
try:
    if which == "vit":
        from transformers import ViTConfig, ViTModel
        model, name = ViTModel(ViTConfig()).eval(), "ViTModel(ViTConfig()) ViT-B/16 86M"
        x = torch.randn(1, 3, 224, 224)
        raise StopIteration
    from transformers import GPT2Config, GPT2Model
    model, name = GPT2Model(GPT2Config()).eval(), "GPT2Model(GPT2Config()) 124M"
    x = torch.randint(0, 50257, (2, 8))
except StopIteration:
    pass
except ImportError:
    layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True)
    model, name = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False).eval(), "TransformerEncoder 85M"
    x = torch.randn(2, 8, 768)
params = sum(p.numel() for p in model.parameters())
t0 = time.perf_counter()
result = {"model": name, "parameters": params, "what": what}
if what == "plain":
    torch.set_num_threads(1)  # as verify runs its checks
    out = model(x)
    y = out[0] if isinstance(out, tuple) else getattr(out, "last_hidden_state", out)
    y.sum().backward()
else:
    import layerlab
    report = layerlab.verify(model, x, only=["gradcheck"] if what == "gradcheck" else None)
    result["checks"] = {c.name: [c.status.value, round(c.seconds, 2)] for c in report.checks}
    result["summary"] = report.check("gradcheck").summary
result["seconds"] = round(time.perf_counter() - t0, 2)
result["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2)
print(json.dumps(result))
"""


def measure_model(which: str = "gpt2") -> dict:
    """gradcheck alone, the whole default verify, and one plain forward+backward, each in its own process."""
    runs = {}
    for what in ("plain", "gradcheck", "verify"):
        done = subprocess.run([sys.executable, "-c", _CHILD, what, which], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{what} exited {done.returncode}:\n{done.stderr[-2000:]}")
        runs[what] = json.loads(done.stdout.strip().splitlines()[-1])
    plain = max(runs["plain"]["seconds"], 1e-9)
    checks = runs["verify"]["checks"]
    return {"model": runs["plain"]["model"], "parameters": runs["plain"]["parameters"], "runs": runs,
            "gradcheck_over_plain": round(runs["gradcheck"]["seconds"] / plain, 1),
            "verify_over_plain": round(runs["verify"]["seconds"] / plain, 1),
            "slowest_check": max(checks.items(), key=lambda kv: kv[1][1])[0],
            "target_s": MODEL_TARGET_S, "ok": runs["verify"]["seconds"] < MODEL_TARGET_S}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["gpt2", "vit"],
                        help="a big model instead of --all: GPT-2 124M, or ViT-B/16 86M at 224×224")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--deep", action="store_true", help="also the deep checks (compile with aot_eager)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.model:
        result = measure_model(args.model)
        if args.json:
            print(json.dumps(result, indent=2))
            return 0 if result["ok"] else 1
        print(f"{result['model']} ({result['parameters']:,} parameters):")
        print(f"{'':24}{'seconds':>9}{'peak RSS GB':>13}{'× plain':>9}")
        for what, r in result["runs"].items():
            ratio = r["seconds"] / max(result["runs"]["plain"]["seconds"], 1e-9)
            print(f"{what:24}{r['seconds']:>9}{r['peak_rss_gb']:>13}{ratio:>9.1f}")
        print("verify, per check (s):", ", ".join(f"{n} {v[1]} ({v[0]})" for n, v in
                                                  sorted(result["runs"]["verify"]["checks"].items(),
                                                         key=lambda kv: -kv[1][1])))
        print(f"slowest check: {result['slowest_check']}; target verify < {MODEL_TARGET_S:.0f} s: "
              f"{'ok' if result['ok'] else 'MISSED'}")
        return 0 if result["ok"] else 1
    result = measure(args.rounds, args.deep)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['command']}: median {result['median_wall_s']} s over {result['rounds']} runs "
              f"({result['wall_s']}); checks {result['checks_s']} s for {result['layers']} layers; "
              f"target < {TARGET_S:.0f} s: {'ok' if result['ok'] else 'MISSED'}")
        print("slowest layers:", ", ".join(f"{n} {s} s" for n, s in result["slowest_layers"]))
        print("time per check:", ", ".join(f"{n} {s} s" for n, s in result["seconds_per_check"].items()))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

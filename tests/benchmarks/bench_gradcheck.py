"""Benchmark: `layerlab gradcheck --all` wall time (issue #5 target: under 2 minutes on CPU).

Runs the command in a fresh process (start-up, imports and every registry layer included) a few
times, prints the median wall time, the slowest layers and the slowest checks from its JSON.

    python tests/benchmarks/bench_gradcheck.py [--rounds 3] [--deep] [--json]
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--deep", action="store_true", help="also the deep checks (compile with aot_eager)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
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

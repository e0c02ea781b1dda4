"""Start-up of a command on a spec: `layerlab inspect configs/cnn_block.yaml` next to its imports.

Runs, interleaved round-robin (drift on a noisy machine hits all alike), the median wall time of:

* ``inspect``       ``layerlab inspect configs/cnn_block.yaml`` (the whole CLI run: imports, the spec,
                    its memory estimate on meta tensors, the forward and backward, the tables)
* ``import torch``  ``python -c "import torch"``
* ``+ dynamo``      ``python -c "import torch, torch._dynamo"``: what every command on a spec paid
                    before the memory estimate stopped importing ``torch._dynamo``
                    (:mod:`layerlab.spec.dynamo_stub`)

and whether ``inspect`` imported ``torch._dynamo`` (checked in a separate run of the same command
in-process). "inspect − import torch" is layerlab's own start-up and the run itself.

    python tests/benchmarks/bench_startup.py [--rounds 9] [--spec configs/cnn_block.yaml]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_IMPORTS_DYNAMO = """
import contextlib, io, sys
from layerlab.cli.app import main
sys.argv = ["layerlab", "inspect", {spec!r}]
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main()
    except SystemExit:
        pass
print("torch._dynamo" in sys.modules)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--spec", default="configs/cnn_block.yaml")
    args = parser.parse_args()
    layerlab = shutil.which("layerlab")
    cli = [layerlab] if layerlab else [sys.executable, "-m", "layerlab"]
    commands = {
        "inspect": cli + ["inspect", args.spec],
        "import torch": [sys.executable, "-c", "import torch"],
        "+ dynamo": [sys.executable, "-c", "import torch, torch._dynamo"],
    }
    times = {name: [] for name in commands}
    for cmd in commands.values():  # warm the file cache once
        subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    for _ in range(args.rounds):
        for name, cmd in commands.items():
            start = time.perf_counter()
            subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(t) for name, t in times.items()}
    dynamo = subprocess.run([sys.executable, "-c", _IMPORTS_DYNAMO.format(spec=args.spec)], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    print(f"median wall time over {args.rounds} interleaved rounds ({args.spec}):")
    for name, value in med.items():
        print(f"  {name:<14} {value:6.2f} s")
    print(f"  inspect − import torch: {med['inspect'] - med['import torch']:.2f} s; "
          f"torch._dynamo costs {med['+ dynamo'] - med['import torch']:.2f} s to import; "
          f"inspect imported it: {dynamo}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

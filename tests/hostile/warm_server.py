"""The fork harness (:mod:`tests.hostile.harness`) with a warmer server, for the new commands' corpus.

:func:`tests.hostile.harness.run_jobs` imports torch and the CLI once before forking; the commands
of issues 13–15 then import another ~800 modules in every child (the target builder, the spec's
memory pre-check, sympy through torch's symbolic shapes, Rich, each command's package), about a
second per run on two cores. Here the server imports them too before the first fork — imports
only: nothing torch-related *runs* before the fork, so each child still starts as a fresh process
would, with the modules already loaded (copy-on-write).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import List

from tests.hostile.harness import CAP_BYTES, REPO, TIMEOUT_S, Job, Outcome, _serve, child_env

#: what the new commands import on their first run (found with ``sys.modules`` before and after)
WARM = (
    "torch", "torch._dynamo", "sympy", "rich.console", "rich.table", "rich.text",
    "layerlab.cli.app", "layerlab.spec", "layerlab.spec.memory", "layerlab.catalog", "layerlab.registry",
    "layerlab.arguments", "layerlab.run_manifest", "layerlab.serialize", "layerlab.target.build",
    "layerlab.target.discover", "layerlab.target.references", "layerlab.cli.output", "layerlab.cli.progress",
    "layerlab.cli.target_arg", "layerlab.cli.train_cmd", "layerlab.cli.precision_cmd", "layerlab.cli.ddp_cmd",
    "layerlab.cli.diff_cmd", "layerlab.cli.inspect_cmd", "layerlab.train.run", "layerlab.mixed",
    "layerlab.distributed.run", "layerlab.probe.run", "layerlab.probe.probes", "layerlab.report_diff",
)


def run_warm(jobs: List[Job], *, workers: int = 2, cap: int = CAP_BYTES, timeout: float = TIMEOUT_S) -> List[Outcome]:
    """:func:`tests.hostile.harness.run_jobs` (fork mode) in a fresh server that imported :data:`WARM` first."""
    with tempfile.TemporaryDirectory(prefix="layerlab-hostile-warm-") as scratch:
        request, reply = Path(scratch) / "jobs.json", Path(scratch) / "outcomes.json"
        request.write_text(json.dumps({"jobs": [asdict(j) for j in jobs], "mode": "fork", "workers": workers,
                                       "cap": cap, "timeout": timeout}))
        budget = timeout * len(jobs) / max(workers, 1) + 120
        subprocess.run([sys.executable, "-m", "tests.hostile.warm_server", str(request), str(reply)],
                       cwd=str(REPO), env=child_env(), check=True, timeout=budget)
        return [Outcome(**o) for o in json.loads(reply.read_text())]


if __name__ == "__main__":
    for name in WARM:
        try:
            importlib.import_module(name)
        except ImportError:  # a module renamed since: the children import what they need anyway
            pass
    _serve(sys.argv[1], sys.argv[2])

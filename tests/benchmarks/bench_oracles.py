"""What the oracles and the fix search add to a failure's diagnosis, and which verdicts they change.

    python tests/benchmarks/bench_oracles.py             # every broken model of the test corpora
    python tests/benchmarks/bench_oracles.py --only corpus

For each broken model of tests/probe (the corpus, the audit rounds, the near misses) and
tests/engine (the search and oracle twins), ``layerlab.inspect(model, *inputs, backward=False)``
runs twice in this process, side by side: with the oracles and the search (as shipped), and with
them turned off (``judge_and_search`` passes the rule's verification through, no search for a
failure no rule recognises) — the verification as it was before. Printed per model: both times
(wall and this process's CPU), the difference, and the verdict when it changed (a rule's "runs"
now ``implausible``, a fix replaced by the search's, a fix found where no rule had one). Then
the median and maximum added time, and the count of changed verdicts.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import layerlab  # noqa: E402
import layerlab.probe.fix_judging as judging  # noqa: E402

SOURCES = ["tests.probe.audit_round3_models", "tests.probe.audit_round4_models", "tests.probe.audit_round6_models",
           "tests.probe.audit_round7_models", "tests.probe.audit_round8_models", "tests.probe.near_miss_models",
           "tests.probe.near_miss_older_models", "tests.probe.near_miss_round8_models"]


def _cases(only):
    """``(name, model, args, kwargs)`` for every case that builds into a model and its inputs."""
    if only in (None, "corpus"):
        from tests.probe.corpus import CASES

        for case in CASES:
            torch.manual_seed(0)
            args, kwargs = case.inputs()
            yield f"corpus/{case.name}", case.model(), args, kwargs
    if only in (None, "engine"):
        from tests.engine.search_models import TWINS

        for twin in TWINS:
            torch.manual_seed(0)
            args, kwargs = twin.inputs()
            yield f"engine/{twin.name}", twin.broken(), args, kwargs
    if only not in (None, "audits"):
        return
    for source in SOURCES:
        module = importlib.import_module(source)
        for table in ("CASES", "NEAR_MISSES"):
            for name, build in getattr(module, table, {}).items():
                try:
                    torch.manual_seed(0)
                    built = build()
                except Exception:  # noqa: BLE001 - a builder that needs arguments: not a broken-model case
                    continue
                if not isinstance(built, tuple):
                    continue
                model = next((b for b in built if isinstance(b, torch.nn.Module)), None)
                rest = [b for b in built[1:] if isinstance(b, (tuple, list, dict))]
                if model is None or not rest:
                    continue
                inputs = rest[0]
                args, kwargs = (tuple(inputs), {}) if isinstance(inputs, (tuple, list)) else ((), dict(inputs))
                yield f"{source.rsplit('.', 1)[1]}/{name}", model, args, kwargs


def _verdict(report):
    f = report.failure
    d = f.diagnosis if f is not None else None
    if d is None:
        return "no diagnosis"
    v = d.verified
    return f"{d.fix.code if d.fix else '(no fix)'} → {v.status if v else '—'}"


def _run(model, args, kwargs):
    torch.manual_seed(0)
    wall, cpu = time.perf_counter(), time.process_time()
    report = layerlab.inspect(model, *args, forward_kwargs=kwargs, backward=False)
    return report, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["corpus", "engine", "audits"])
    ns = parser.parse_args()
    on, off_judge, off_search = judging.judge_and_search, (lambda *a, **k: a[6]), (lambda *a, **k: None)
    added, changed, rows = [], [], 0
    print(f"{'model':48} {'off s':>7} {'on s':>7} {'added':>7} {'cpu+':>7}  verdict")
    for name, model, args, kwargs in _cases(ns.only):
        judging.judge_and_search, judging.search_diagnosis = off_judge, off_search
        try:
            before, wall_off, cpu_off = _run(model, args, kwargs)
        finally:
            judging.judge_and_search, judging.search_diagnosis = on, _SEARCH
        if before.failure is None:
            continue
        after, wall_on, cpu_on = _run(model, args, kwargs)
        rows += 1
        added.append(wall_on - wall_off)
        a, b = _verdict(before), _verdict(after)
        note = "" if a == b else f"  CHANGED: {a}  ⇒  {b}"
        if note:
            changed.append(name)
        print(f"{name[:48]:48} {wall_off:7.2f} {wall_on:7.2f} {wall_on - wall_off:+7.2f} {cpu_on - cpu_off:+7.2f}{note}")
    if added:
        print(f"\n{rows} failing models: added wall time median {statistics.median(added):+.2f} s, "
              f"max {max(added):+.2f} s; {len(changed)} verdicts changed")


_SEARCH = judging.search_diagnosis

if __name__ == "__main__":
    main()

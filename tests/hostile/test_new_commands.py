"""Hostile input for the commands and options of issues 13–15 (``train-check``, ``precision-check``,
``ddp-check``, ``inspect --probe/--steps/--plot/--compare``, ``diff``): every case in
:mod:`tests.hostile.corpus_new` runs as its own process under the harness's memory cap and time
limit, and must keep the issue-11 contract (:mod:`tests.hostile.verdict`: the allowed exit code,
no traceback, one message, no raw control characters, bounded output, ``--json`` stays JSON) —
and a refusal must say where (the spec's ``file:line``, the option, the JSON path).

CI runs every case with and without ``--json`` (about 470 runs, ~35 s on two cores, thanks to the
warm fork server of :mod:`tests.hostile.warm_server`; a sample is checked against real
``python -m layerlab`` processes). ``python -m tests.hostile.test_new_commands`` prints the figures.
"""

from __future__ import annotations

import collections
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from tests.hostile.corpus_new import Case, all_cases, materialize
from tests.hostile.harness import Job, Outcome
from tests.hostile.verdict import problems
from tests.hostile.warm_server import run_warm

CASES = all_cases()
MAX_SECONDS = 30.0
MAX_RSS_MB = 1500


def runs(full: bool = True) -> List[Tuple[Case, bool]]:
    """(case, --json) pairs: every case both ways (``full``), else each once, alternating."""
    out = []
    for i, case in enumerate(CASES):
        modes = case.json_modes if full else (case.json_modes[i % len(case.json_modes)],)
        out += [(case, j) for j in modes]
    return out


def run_id(case: Case, json_mode: bool) -> str:
    return case.name + (" --json" if json_mode else "")


def execute(selection: List[Tuple[Case, bool]], root: Path) -> Dict[str, Tuple[Outcome, str]]:
    jobs = []
    for case, json_mode in selection:
        folder = root / case.name
        if not folder.exists():
            materialize(case, folder)
        jobs.append(Job(id=run_id(case, json_mode), argv=list(case.argv) + (["--json"] if json_mode else []),
                        cwd=str(folder)))
    outcomes = run_warm(jobs, timeout=60.0)
    return {job.id: (outcome, job.cwd) for job, outcome in zip(jobs, outcomes)}


def broken(case: Case, json_mode: bool, outcome: Outcome, cwd: str) -> List[str]:
    """Everything wrong with one run (empty: it kept the contract)."""
    found = problems(case, case.argv[0], json_mode, outcome, cwd)
    if outcome.rc == 2 and case.where and case.where not in outcome.stderr:
        found.append(f"the refusal does not say where ({case.where!r})")
    if (Path(cwd) / "RAN").exists() and "--allow-import" not in case.argv:
        found.append("RAN exists: code ran without --allow-import")
    if outcome.seconds > MAX_SECONDS and not outcome.timed_out:
        found.append(f"took {outcome.seconds:.0f} s (limit {MAX_SECONDS:.0f} s)")
    if outcome.maxrss_kb > MAX_RSS_MB * 1024:
        found.append(f"peak memory {outcome.maxrss_kb // 1024} MB (limit {MAX_RSS_MB} MB)")
    return found


RUNS = runs()


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    return execute(RUNS, tmp_path_factory.mktemp("hostile-new"))


def test_corpus_covers_every_new_surface():
    causes = {c.cause for c in CASES}
    assert len(CASES) >= 200
    assert {"train-section", "train-option", "train-target", "train-output", "import", "precision-section",
            "precision-option", "ddp-section", "ddp-option", "ddp-batch", "probe-option", "probe-import",
            "probe-section", "steps", "plot", "compare", "diff-file", "diff-json", "diff-schema", "diff-kind",
            "diff-echo", "diff-spec", "diff-option"} <= causes
    commands = {c.argv[0] for c in CASES}
    assert commands == {"train-check", "precision-check", "ddp-check", "inspect", "diff"}


@pytest.mark.parametrize("case,json_mode", RUNS, ids=[run_id(c, j) for c, j in RUNS])
def test_hostile_input_is_refused_cleanly(case, json_mode, outcomes):
    outcome, cwd = outcomes[run_id(case, json_mode)]
    found = broken(case, json_mode, outcome, cwd)
    assert not found, (f"{run_id(case, json_mode)} [{case.cause}] exit {outcome.rc}: {'; '.join(found)}\n"
                       f"--- stderr ---\n{outcome.stderr[:3000]}\n--- stdout ---\n{outcome.stdout[:1500]}")


EXEC_SAMPLE = ("train_lr_nan", "ddp_cli_timeout_huge", "probe_huge_name", "diff_huge_nesting_list", "steps_on_mlp")


def test_warm_fork_runs_match_real_processes(outcomes, tmp_path):
    """The warm server is faithful: a real ``python -m layerlab`` gives the same exit code and the
    same first line on stderr, on a sample (spec refusals, option refusals, a diff refusal, a success)."""
    from tests.hostile.harness import run_via_server

    sample = [(c, j) for c, j in RUNS if c.name in EXEC_SAMPLE and not j]
    jobs = []
    for case, json_mode in sample:
        folder = tmp_path / case.name
        materialize(case, folder)
        jobs.append(Job(id=run_id(case, json_mode), argv=list(case.argv), cwd=str(folder)))
    real = run_via_server(jobs, mode="exec")
    for (case, json_mode), outcome in zip(sample, real):
        forked, _ = outcomes[run_id(case, json_mode)]
        assert (outcome.rc, outcome.timed_out) == (forked.rc, forked.timed_out), case.name
        assert outcome.stderr.split("\n", 1)[0] == forked.stderr.split("\n", 1)[0], case.name


def main() -> int:
    """Every case, human and --json: how many runs, exit codes, breaks by cause, slowest, peak memory."""
    selection = runs()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="layerlab-hostile-new-") as root:
        results = execute(selection, Path(root))
        verdicts = [(c, j, results[run_id(c, j)][0], broken(c, j, *results[run_id(c, j)])) for c, j in selection]
    rcs = collections.Counter(o.rc for _, _, o, _ in verdicts)
    bad = [(c, j, o, f) for c, j, o, f in verdicts if f]
    slowest = max(verdicts, key=lambda v: v[2].seconds)
    worst = max(verdicts, key=lambda v: v[2].maxrss_kb)
    print(f"{len(CASES)} cases, {len(verdicts)} runs in {time.monotonic() - started:.0f} s; exit codes: "
          + ", ".join(f"{rc}: {n}" for rc, n in sorted(rcs.items(), key=str)))
    print(f"slowest: {slowest[2].seconds:.1f} s ({run_id(slowest[0], slowest[1])}); peak memory "
          f"{worst[2].maxrss_kb // 1024} MB ({run_id(worst[0], worst[1])})")
    print(f"broken: {len(bad)}")
    for c, j, o, f in bad:
        print(f"  [{c.cause}] {run_id(c, j)}: exit {o.rc}: {'; '.join(f)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

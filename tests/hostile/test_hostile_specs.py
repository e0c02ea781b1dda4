"""Every hostile spec through the commands that take one: exit code, one message, no traceback,
no raw control characters, bounded output, time and memory (see :mod:`tests.hostile.verdict`).

Runs are separate processes under a 3 GB address-space cap and a 60 s limit. CI runs every
entry through ``inspect`` and ``inspect --json``, the core entries through every command and a
seeded rotation of the rest (``LAYERLAB_HOSTILE_SEED`` reproduces a day's choice; see
:mod:`tests.hostile.matrix`). ``python -m tests.hostile.measure`` runs the full matrix.
"""

from __future__ import annotations

import pytest

from tests.hostile.corpus import all_entries
from tests.hostile.harness import run_via_server
from tests.hostile.matrix import ci_selection, jobs_for, rotation_seed
from tests.hostile.verdict import cause_line, problems

ENTRIES = all_entries()
SEED = rotation_seed()
RUNS = ci_selection(ENTRIES, SEED)
MAX_SECONDS = 45.0       # a run may take this long; the harness kills at 60 s
MAX_RSS_MB = 1500        # peak resident memory of any run (a tiny layer needs ~400 MB with torch)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Write the corpus into a fresh folder and run the CI selection once (fork mode, 2 at a time)."""
    jobs = jobs_for(RUNS, tmp_path_factory.mktemp("hostile"))
    results = run_via_server(list(jobs.values()), mode="fork")
    return {job_id: (outcome, jobs[job_id].cwd) for job_id, outcome in zip(jobs, results)}


def test_corpus_is_large_and_covers_every_cause():
    causes = {e.cause for e in ENTRIES}
    assert len(ENTRIES) >= 60
    assert {"alias-bomb", "recursive-alias", "nesting", "bytes", "encoding", "size", "special-file", "yaml-tag",
            "repeat", "seed-overflow", "memory", "import", "user-code", "input-name", "batch-dims", "device",
            "echo", "unwritable-output", "huge-dim", "wrong-type", "unknown-key", "document"} <= causes


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.id)
def test_hostile_run_behaves(run, outcomes):
    outcome, cwd = outcomes[run.id]
    found = problems(run.entry, run.command, run.json_mode, outcome, cwd)
    if outcome.seconds > MAX_SECONDS and not outcome.timed_out:
        found.append(f"took {outcome.seconds:.0f} s (limit {MAX_SECONDS:.0f} s)")
    if outcome.maxrss_kb > MAX_RSS_MB * 1024:
        found.append(f"peak memory {outcome.maxrss_kb // 1024} MB (limit {MAX_RSS_MB} MB)")
    assert not found, (f"{cause_line(run.entry, run.command, run.json_mode, outcome, found)}\n"
                       f"(rotation seed {SEED})\n--- stderr ---\n{outcome.stderr[:3000]}\n"
                       f"--- stdout ---\n{outcome.stdout[:1500]}")


EXEC_SAMPLE = ("nul_byte", "alias_bomb_1e9", "dev_zero", "tiny_valid")


def test_fork_runs_match_real_processes(outcomes, tmp_path):
    """The fork harness is faithful: a real `python -m layerlab` gives the same exit code and the
    same first stderr line on a sample (a refusal, a resource guard, a special file, a success)."""
    runs = [r for r in RUNS if r.entry.name in EXEC_SAMPLE and r.command == "inspect" and r.json_mode]
    jobs = jobs_for(runs, tmp_path)
    real = run_via_server(list(jobs.values()), mode="exec")
    for run, outcome in zip(runs, real):
        forked, _ = outcomes[run.id]
        assert (outcome.rc, outcome.timed_out) == (forked.rc, forked.timed_out), run.id
        first = lambda text: text.split("\n", 1)[0].split('"where"')[0]  # noqa: E731 - paths differ
        assert first(outcome.stderr) == first(forked.stderr), run.id

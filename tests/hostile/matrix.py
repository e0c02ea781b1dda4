"""Which (entry, command, --json) runs to make: the full matrix, or the CI selection.

The full matrix is every entry through every command it applies to, with and without
``--json``; ``measure.py`` runs it. CI runs every entry through ``inspect`` and
``inspect --json`` (the command each item of issue 11 reaches first), the :data:`CORE` entries
through every command, and a seeded rotation of ``ROTATING`` more entries per other command.
The seed is ``LAYERLAB_HOSTILE_SEED`` if set, else the UTC day number, so CI sweeps the whole
corpus over the days while any one run stays reproducible.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Sequence

from tests.hostile.corpus import COMMANDS, CORE, Entry, materialize
from tests.hostile.harness import Job

ROTATING = 4


@dataclass(frozen=True)
class Run:
    entry: Entry
    command: str
    json_mode: bool

    @property
    def id(self) -> str:
        return f"{self.command}{'-json' if self.json_mode else ''}:{self.entry.name}"


def rotation_seed() -> int:
    return int(os.environ.get("LAYERLAB_HOSTILE_SEED", int(time.time() // 86400)))


def full_matrix(entries: Sequence[Entry]) -> List[Run]:
    return [Run(e, c, j) for e in entries for c in COMMANDS if c in e.commands for j in (False, True)]


def ci_selection(entries: Sequence[Entry], seed: int) -> List[Run]:
    runs = [Run(e, "inspect", j) for e in entries if "inspect" in e.commands for j in (False, True)]
    rng = random.Random(seed)
    for command in COMMANDS[1:]:
        applicable = [e for e in entries if command in e.commands]
        core = [e for e in applicable if e.name in CORE or e.commands == (command,)]
        rest = [e for e in applicable if e not in core]
        chosen = core + rng.sample(rest, min(ROTATING, len(rest)))
        runs += [Run(e, command, j) for e in chosen for j in (False, True)]
    return runs


def jobs_for(runs: Iterable[Run], root: Path) -> Dict[str, Job]:
    """Write each entry once under ``root`` (its own folder) and make one job per run."""
    paths: Dict[str, str] = {}
    jobs: Dict[str, Job] = {}
    for run in runs:
        entry = run.entry
        folder = root / entry.name
        if entry.name not in paths:
            paths[entry.name] = materialize(entry, folder)
        argv = [run.command, paths[entry.name], *entry.args] + (["--json"] if run.json_mode else [])
        jobs[run.id] = Job(id=run.id, argv=argv, cwd=str(folder))
    return jobs

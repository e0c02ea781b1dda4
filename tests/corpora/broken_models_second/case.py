"""One broken model: the model that raises, its hand-fixed twin, inputs, and the graded answer.

The fields are the ones ``../broken_models/grade.py`` reads (its grading logic is reused as is):

* ``build_broken`` / ``build_twin``: the broken model and the fixed one, with the same parameter
  names (the broken class subclasses the twin and overrides only what is wrong), so one state_dict
  loads into both. ``shares_weights``: the shapes agree too (the twin's weights load into the
  broken model before it is inspected);
* ``loss_broken`` / ``loss_twin``: where the error is in the loss, ``loss(out, *targets)``;
* ``where_paths``: module paths that count as naming the bug; ``fix_at``: module paths where the
  right fix goes; ``fix_at_line``: the right fix edits a line marked ``# BUG(name)`` in a models
  file; ``fix_patterns``: regexes a right fix text matches (a pattern match is only "unsure" until
  hand-graded); ``danger_patterns``: regexes of fixes known to run and compute another model;
  ``locate_patterns``: regexes on the diagnosis that name the bug (for a bug in an input or loss);
* ``near_miss``: the obvious quick fix runs but computes another model; the right fix is elsewhere;
* ``hand``: judgements keyed by the fingerprint of the first fix's text (see hand_grades.py).
"""

from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

import torch


@dataclass(frozen=True)
class BrokenCase:
    name: str
    area: str
    build_broken: Callable[[], torch.nn.Module]
    build_twin: Callable[[], torch.nn.Module]
    make_inputs: Callable[[], Tuple]
    where: str
    right_fix: str
    near_miss: bool = False
    shares_weights: bool = True
    make_twin_inputs: Optional[Callable[[], Tuple]] = None
    make_targets: Optional[Callable[[], Tuple]] = None
    loss_broken: Optional[Callable] = None
    loss_twin: Optional[Callable] = None
    where_paths: Tuple[str, ...] = ()
    locate_patterns: Tuple[str, ...] = ()
    fix_patterns: Tuple[str, ...] = ()
    fix_at: Tuple[str, ...] = ()
    fix_at_line: bool = False
    danger_patterns: Tuple[str, ...] = ()
    hand: Dict[str, dict] = field(default_factory=dict)


def gen(seed: int = 0) -> torch.Generator:
    """A seeded generator, so every case's inputs are the same on every run."""
    return torch.Generator().manual_seed(seed)


def seeded(cls, *args, **kwargs) -> Callable[[], torch.nn.Module]:
    """A builder of ``cls(*args, **kwargs)`` with weights drawn from seed 0 (global RNG left alone)."""

    def build() -> torch.nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return cls(*args, **kwargs)

    return build

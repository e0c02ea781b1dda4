"""Whether a profile's timings can be trusted: bounded step counts, and steps that vary too much.

A mistyped ``--repeats 10**11`` must be refused, not run for days; and on a machine whose cores
other processes use, the medians can be nonsense. The report says so instead of showing it
(:func:`unsteady_note`).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from layerlab.errors import UsageError
from layerlab.profiling.report import StepTiming

__all__ = ["MAX_STEPS", "check_steps", "unsteady_note"]


#: Most timed rounds (and warm-up steps) one run takes: medians settle within a few dozen, and a
#: mistyped 10**11 would otherwise run for days instead of being refused.
MAX_STEPS = 10_000


def check_steps(value: Any, name: str, low: int) -> None:
    """``repeats`` / ``warmup``: an integer in ``low … MAX_STEPS`` (a clear refusal, not a hang)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{name} must be an integer, got {type(value).__name__}", where=f"--{name}",
                         expected=f"an integer {low} … {MAX_STEPS}", got=repr(value))
    if not low <= value <= MAX_STEPS:
        raise UsageError(f"--{name} must be between {low} and {MAX_STEPS}, got {value}", where=f"--{name}",
                         expected=f"{low} … {MAX_STEPS}", got=value,
                         hint="medians settle within a few dozen rounds; more only takes longer")


#: Plain steps whose upper quartile is this many times the lower one are not one measurement.
UNSTEADY_SPREAD = 2.0
#: A step with the profiler's hooks cannot be this much faster than the same step without them.
UNSTEADY_OVERHEAD = -0.25


def unsteady_note(step: StepTiming) -> Optional[str]:
    """What to say when the timings cannot be trusted, else ``None``.

    On a machine whose cores other processes are using, a kernel split over several intra-op
    threads waits at its barrier for the busy one: steps then take anything from 1× to 20× their
    time. Medians hide a few such steps, not a majority, and the report would show nonsense (the
    hooked step "94 % faster" than the plain one). The plain steps' quartiles and the sign of the
    overhead tell."""
    samples = sorted(step.samples_step_s)
    spread = None
    if len(samples) >= 4 and samples[len(samples) // 4] > 0:
        spread = samples[(3 * len(samples)) // 4] / samples[len(samples) // 4]
    elif len(samples) >= 2 and samples[0] > 0:  # too few for quartiles: the extremes, with a wider bar
        spread = samples[-1] / samples[0] / UNSTEADY_SPREAD
    if not ((spread is not None and spread > UNSTEADY_SPREAD) or step.overhead < UNSTEADY_OVERHEAD):
        return None
    seen = f"plain steps took {1e3 * samples[0]:.3g}–{1e3 * samples[-1]:.3g} ms" if samples else "the steps varied"
    threads = torch.get_num_threads()
    why, rerun = ("other processes are using the cores, and a kernel split over "
                  f"{threads} threads waits for the busy one", "rerun with --threads 1, or with more --repeats "
                  "when the machine is quieter") if threads > 1 else \
        ("other processes are using the core", "rerun with more --repeats when the machine is quieter")
    return (f"timings are unsteady ({seen}, median {1e3 * step.step_s:.3g} ms; with hooks "
            f"{1e3 * step.profiled_step_s:.3g} ms): {why}. The per-row times and the overhead are not reliable: "
            f"{rerun}")

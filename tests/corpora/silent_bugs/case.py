"""One silent shape bug: a buggy model, its correct twin, inputs that hide the bug, and the answer.

A silent shape bug runs without error (sizes coincide, or broadcasting hides it) and trains on the
wrong computation. Each case pairs the buggy model with a correct twin that has the same parameter
names (the buggy class subclasses the twin and overrides only what is wrong), so one state_dict
loads into both and their outputs can be compared on the same weights.
"""

import inspect as pyinspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Tuple

import torch


@dataclass(frozen=True)
class SilentBugCase:
    """What a grader needs to know about one bug.

    ``op`` is the torch op or module call that is wrong (``aliases``: other names a report may use
    for it, such as the module's attribute path); ``line`` is a substring of the buggy source line,
    unique within the buggy class's source.
    """

    name: str
    area: str
    build_buggy: Callable[[], torch.nn.Module]
    build_twin: Callable[[], torch.nn.Module]
    make_inputs: Callable[[], Tuple]
    op: str
    line: str
    intent: str
    aliases: Tuple[str, ...] = field(default=())

    def buggy_location(self) -> Tuple[str, int]:
        """(file name, line number) of the buggy source line, found in the buggy class's source."""
        cls = type(self.build_buggy())
        for klass in cls.__mro__:
            if klass is torch.nn.Module:
                break
            source, first = pyinspect.getsourcelines(klass)
            hits = [first + i for i, text in enumerate(source) if self.line in text]
            if len(hits) == 1:
                return Path(pyinspect.getsourcefile(klass)).name, hits[0]
            if len(hits) > 1:
                raise ValueError(f"{self.name}: line {self.line!r} occurs {len(hits)} times in {klass.__name__}")
        raise ValueError(f"{self.name}: line {self.line!r} is not in {cls.__name__}'s source")


def generator(seed: int = 0) -> torch.Generator:
    """A seeded generator, so every case's inputs are the same on every run."""
    return torch.Generator().manual_seed(seed)


def seeded(cls, *args, **kwargs) -> Callable[[], torch.nn.Module]:
    """A builder of ``cls(*args, **kwargs)`` with weights drawn from seed 0 (the global RNG is left alone)."""

    def build() -> torch.nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return cls(*args, **kwargs)

    return build

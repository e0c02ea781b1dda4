"""torch as the test oracle for the shape arithmetic.

Run the real op on real CPU tensors (batch kept small, one intra-op thread — the exact, fast
oracle per shape_rules.md §13, and it keeps the CPU backend on its readable error messages)
and compare torch's outcome with layerlab's: the same shape, or the same exception class and
first message line.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch

import pytest

from layerlab.errors import TorchWouldRaise
from layerlab.shapes import explain, output_shape

torch.set_num_threads(1)


@dataclass
class Outcome:
    shape: Optional[Tuple[int, ...]] = None
    exc: Optional[str] = None
    message: Optional[str] = None

    @property
    def raised(self) -> bool:
        return self.exc is not None


def first_line(text: str) -> str:
    return str(text).strip().splitlines()[0] if str(text).strip() else ""


def torch_outcome(fn: Callable[[], "torch.Tensor"]) -> Outcome:
    """Run ``fn`` (builds the module and calls it) and record the shape or the exception."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.no_grad():
                out = fn()
    except Exception as exc:  # the oracle records whatever torch raises
        return Outcome(exc=type(exc).__name__, message=first_line(str(exc)))
    if isinstance(out, tuple):  # return_indices=True
        out = out[0]
    return Outcome(shape=tuple(out.shape))


def layerlab_outcome(op: str, shape, **params) -> Outcome:
    ex = explain(op, shape, **params)
    if ex.error is not None:
        err: TorchWouldRaise = ex.error
        return Outcome(exc=err.torch_exception, message=first_line(err.torch_message))
    return Outcome(shape=tuple(ex.output_shape))


_SET = re.compile(r"\{('[^']*'(?:, '[^']*')*)\}")


def normalise_message(msg: Optional[str]) -> Optional[str]:
    """Sort the items of quoted Python sets: their order changes with PYTHONHASHSEED."""
    if msg is None:
        return None
    return _SET.sub(lambda m: "{" + ", ".join(sorted(m.group(1).split(", "))) + "}", msg)


def assert_same_outcome(ours: Outcome, theirs: Outcome, context: str = "", check_message: bool = True) -> None:
    """Shapes equal; or both raise, the same class and (by default) the same first line."""
    where = f"\n  case: {context}\n  torch:    {theirs}\n  layerlab: {ours}"
    if theirs.raised:
        assert ours.raised, "torch raises but layerlab predicts a shape" + where
        assert ours.exc == theirs.exc, "different exception class" + where
        if check_message:
            assert normalise_message(ours.message) == normalise_message(theirs.message), "different message" + where
    else:
        assert not ours.raised, "layerlab predicts an error but torch returns a shape" + where
        assert ours.shape == theirs.shape, "different shape" + where


def assert_edge_case(theirs: Outcome, op: str, shape, params: dict, expected) -> None:
    """An edge case written out in a test: torch's outcome is ``expected`` — a shape, or
    ``(exception class, first message line)`` — and layerlab's ``output_shape`` agrees."""
    if isinstance(expected[0], str):
        assert (theirs.exc, theirs.message) == expected
        with pytest.raises(TorchWouldRaise) as info:
            output_shape(op, shape, **params)
        assert (info.value.torch_exception, info.value.torch_message) == expected
    else:
        assert theirs.shape == expected
        assert output_shape(op, shape, **params) == expected

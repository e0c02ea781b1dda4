"""nn.Flatten shape arithmetic against the real torch module (shape_rules.md §10, §15 E48)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layerlab.errors import TorchWouldRaise
from layerlab.shapes import explain, output_shape
from tests.shapes.oracle import Outcome, assert_same_outcome, layerlab_outcome, torch_outcome


def check(shape, **params) -> Outcome:
    theirs = torch_outcome(lambda: torch.nn.Flatten(**params)(torch.zeros(shape)))
    assert_same_outcome(layerlab_outcome("flatten", shape, **params), theirs, f"flatten{tuple(shape)} {params}")
    return theirs


@settings(max_examples=100, deadline=None, derandomize=True)
@given(shape=st.lists(st.integers(0, 4), min_size=0, max_size=5), start=st.integers(-6, 5), end=st.integers(-6, 5),
       defaults=st.sampled_from(["both", "start", "end", "none"]))
def test_flatten_matches_torch(shape, start, end, defaults):
    params = {"both": {}, "start": {"end_dim": end}, "end": {"start_dim": start},
              "none": {"start_dim": start, "end_dim": end}}[defaults]
    check(tuple(shape), **params)


def test_e48_default_flatten_on_1d():
    theirs = check((5,))
    assert (theirs.exc, theirs.message) == (
        "IndexError", "Dimension out of range (expected to be in range of [-1, 0], but got 1)")
    with pytest.raises(TorchWouldRaise, match="the input has one dim only") as info:
        output_shape("flatten", (5,))
    assert info.value.suggestions == ["start_dim=0"]


@pytest.mark.parametrize("shape,params,expected", [
    ((2, 3, 4, 5), {}, (2, 60)),
    ((2, 3, 4, 5), dict(start_dim=-3, end_dim=-2), (2, 12, 5)),
    ((), dict(start_dim=0), (1,)),
    ((2, 0, 4, 5), dict(start_dim=1, end_dim=2), (2, 0, 5)),
    ((2, 3), dict(start_dim=1, end_dim=1), (2, 3)),
])
def test_flatten_shapes(shape, params, expected):
    assert check(shape, **params).shape == expected
    assert output_shape("flatten", shape, **params) == expected


def test_start_after_end():
    theirs = check((2, 3), start_dim=1, end_dim=0)
    assert theirs.message == "flatten() has invalid args: start_dim cannot come after end_dim"
    with pytest.raises(TorchWouldRaise, match="the range is empty"):
        output_shape("flatten", (2, 3), start_dim=1, end_dim=0)


def test_step_shows_the_product():
    ex = explain("flatten", (2, 3, 4, 5))
    (step,) = ex.steps
    assert (step.formula, step.substituted, step.output) == ("prod(shape[1:4])", "3 · 4 · 5", 60)

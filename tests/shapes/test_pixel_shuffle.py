"""PixelShuffle / PixelUnshuffle against the real modules (shape_rules.md §9, §15)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layerlab.errors import TorchWouldRaise
from layerlab.shapes import explain, output_shape
from tests.shapes.oracle import Outcome, assert_edge_case, assert_same_outcome, layerlab_outcome, torch_outcome

nn = torch.nn


def run_torch(op: str, shape, params) -> Outcome:
    cls = nn.PixelShuffle if op == "pixel_shuffle" else nn.PixelUnshuffle
    return torch_outcome(lambda: cls(**params)(torch.zeros(shape)))


def check(op: str, shape, params) -> Outcome:
    theirs = run_torch(op, shape, params)
    assert_same_outcome(layerlab_outcome(op, shape, **params), theirs, f"{op}{tuple(shape)} {params}")
    return theirs


@st.composite
def pixel_cases(draw):
    op = draw(st.sampled_from(["pixel_shuffle", "pixel_unshuffle"]))
    r = draw(st.sampled_from([1, 2, 2, 2, 3, 3, 4] * 3 + [0, -1]))
    rank = draw(st.sampled_from([3, 4, 4, 4, 5] * 4 + [0, 1, 2, 6]))
    m = max(r, 1)
    # Mostly sizes that divide, sometimes not; rarely empty dims.
    size = st.one_of(st.integers(1, 4).map(lambda q: q * m), st.integers(1, 4).map(lambda q: q * m * m),
                     st.integers(1, 13), st.just(0))
    dims = [draw(size) for _ in range(rank)]
    if rank >= 4:
        dims[0] = draw(st.sampled_from([0, 1, 2]))
    key = "upscale_factor" if op == "pixel_shuffle" else "downscale_factor"
    return op, tuple(dims), {key: r}


@settings(max_examples=150, deadline=None, derandomize=True)
@given(pixel_cases())
def test_pixel_shuffle_matches_torch(case):
    op, shape, params = case
    check(op, shape, params)


RE = "RuntimeError"
EDGE = [
    ("E50", "pixel_shuffle", (2, 1, 8, 3, 3), dict(upscale_factor=2), (2, 1, 2, 6, 6)),
    ("unshuffle", "pixel_unshuffle", (1, 3, 8, 6), dict(downscale_factor=2), (1, 12, 4, 3)),
    ("rank", "pixel_shuffle", (8, 3), dict(upscale_factor=2),
     (RE, "pixel_shuffle expects input to have at least 3 dimensions, but got input with 2 dimension(s)")),
    ("r=0", "pixel_shuffle", (8, 3, 3), dict(upscale_factor=0),
     (RE, "pixel_shuffle expects a positive upscale_factor, but got 0")),
    ("channels", "pixel_shuffle", (1, 10, 3, 3), dict(upscale_factor=3),
     (RE, "pixel_shuffle expects its input's 'channel' dimension to be divisible by the square of upscale_factor, "
          "but input.size(-3)=10 is not divisible by 9")),
    ("down=0", "pixel_unshuffle", (5, 3, 3), dict(downscale_factor=0),
     (RE, "pixel_unshuffle expects a positive downscale_factor, but got 0")),
    ("height", "pixel_unshuffle", (1, 5, 5), dict(downscale_factor=2),
     (RE, "pixel_unshuffle expects height to be divisible by downscale_factor, but input.size(-2)=5 is not "
          "divisible by 2")),
    ("width", "pixel_unshuffle", (1, 4, 5), dict(downscale_factor=2),
     (RE, "pixel_unshuffle expects width to be divisible by downscale_factor, but input.size(-1)=5 is not "
          "divisible by 2")),
    # torch 2.13 quirk (not in the spec): an empty input comes back with its shape unchanged
    ("unshuffle-empty", "pixel_unshuffle", (0, 2, 4, 4), dict(downscale_factor=2), (0, 2, 4, 4)),
    ("shuffle-empty", "pixel_shuffle", (0, 8, 3, 3), dict(upscale_factor=2), (0, 2, 6, 6)),
]


@pytest.mark.parametrize("case_id, op, shape, params, expected", EDGE, ids=[e[0] for e in EDGE])
def test_edge_cases(case_id, op, shape, params, expected):
    assert_edge_case(check(op, shape, params), op, shape, params, expected)


def test_error_suggests_channel_counts():
    with pytest.raises(TorchWouldRaise, match=r"channels 10 are not divisible by upscale_factor² = 9") as info:
        output_shape("pixel_shuffle", (1, 10, 3, 3), upscale_factor=3)
    assert info.value.suggestions[0] == "C = 9 or 18"


def test_steps_and_empty_note():
    ex = explain("pixel_shuffle", (1, 12, 3, 4), upscale_factor=2)
    assert [(s.dim, s.input, s.output) for s in ex.steps] == [("C", 12, 3), ("H", 3, 6), ("W", 4, 8)]
    ex = explain("pixel_unshuffle", (0, 2, 4, 4), downscale_factor=2)
    (note,) = ex.notes
    assert note.data == {"arithmetic": (0, 8, 2, 2)}

"""AdaptiveAvgPool / AdaptiveMaxPool 1d/2d/3d against the real torch modules (shape_rules.md §6, §15)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layerlab.errors import TorchWouldRaise
from layerlab.shapes import explain, output_shape
from tests.shapes.oracle import Outcome, assert_edge_case, assert_same_outcome, layerlab_outcome, torch_outcome
from tests.shapes.strategies import mostly

nn = torch.nn


def run_torch(op: str, shape, params) -> Outcome:
    kind, nd = op.split("_")[1], int(op[-2])
    cls = getattr(nn, f"Adaptive{kind.capitalize()}Pool{nd}d")
    return torch_outcome(lambda: cls(**params)(torch.zeros(shape)))


def check(op: str, shape, params) -> Outcome:
    theirs = run_torch(op, shape, params)
    assert_same_outcome(layerlab_outcome(op, shape, **params), theirs, f"{op}{tuple(shape)} {params}")
    return theirs


@st.composite
def adaptive_cases(draw):
    kind = draw(st.sampled_from(["avg", "max"]))
    nd = draw(st.sampled_from([1, 2, 3]))
    rank = draw(st.sampled_from([nd + 2] * 16 + [nd + 1] * 8 + [-1] * 3))
    if rank == -1:
        rank = draw(st.integers(0, 6))
    dims = [draw(mostly(range(1, 13), [0])) for _ in range(rank)]
    if rank == nd + 2:
        dims[:2] = [draw(st.sampled_from([1, 1, 2, 0])), draw(mostly([1, 2], [0]))]
    # 1 (the avg fast path) and None (keep the input dim) often; 0 and negatives rarely.
    entry = mostly(list(range(1, 13)) + [1, 1, 1] + ([None] * 3 if nd > 1 else []), [0, -1, -2] + [None] * (nd == 1))
    form = draw(st.sampled_from(["int"] * 5 + ["tuple"] * 8 + ["bad"]))
    if form == "int":
        size = draw(entry.filter(lambda v: v is not None))
    elif form == "tuple":
        size = tuple(draw(entry) for _ in range(nd))
    else:
        size = tuple(draw(entry) for _ in range(draw(st.sampled_from([n for n in range(5) if n != nd]))))
    params = dict(output_size=size)
    if kind == "max":
        params["return_indices"] = draw(st.booleans())
    return f"adaptive_{kind}_pool{nd}d", tuple(dims), params


@settings(max_examples=400, deadline=None, derandomize=True)
@given(adaptive_cases())
def test_adaptive_pools_match_torch(case):
    op, shape, params = case
    check(op, shape, params)


# --------------------------------------------------------------------------------------------
# §15 edge cases, with torch's answers written out

RE = "RuntimeError"
EDGE = [
    ("E34", "adaptive_avg_pool1d", (1, 1, 10), dict(output_size=4), (1, 1, 4)),
    ("E35", "adaptive_max_pool1d", (1, 1, 3), dict(output_size=7), (1, 1, 7)),
    ("E36", "adaptive_avg_pool2d", (5, 5), dict(output_size=1), (1, 1)),
    ("E37", "adaptive_avg_pool2d", (1, 1, 0, 5), dict(output_size=1), (1, 1, 1, 1)),
    ("E38", "adaptive_avg_pool2d", (1, 1, 0, 5), dict(output_size=(1, 2)),
     (RE, "adaptive_avg_pool2d(): Expected input to have non-zero size for non-batch dimensions, but input has "
          "sizes [1, 1, 0, 5] with dimension 2 being empty")),
    ("E39", "adaptive_max_pool2d", (1, 1, 5, 5), dict(output_size=-1),
     (RE, "Trying to create tensor with negative dimension -1: [1, 1, -1, -1]")),
    ("6.1-None", "adaptive_avg_pool2d", (2, 3, 7, 9), dict(output_size=(None, 4)), (2, 3, 7, 4)),
    ("6.1-None-unbatched", "adaptive_max_pool3d", (3, 5, 6, 7), dict(output_size=(2, None, None)), (3, 2, 6, 7)),
    ("6.1-zero", "adaptive_max_pool2d", (1, 2, 5, 5), dict(output_size=0), (1, 2, 0, 0)),
    ("6.3-fast-5d", "adaptive_avg_pool3d", (1, 1, 5, 5, 5, 5), dict(output_size=(1, 1, 1)), (1, 1, 5, 1, 1, 1)),
    ("6.3-neg-avg", "adaptive_avg_pool2d", (1, 1, 5, 5), dict(output_size=(-1, 2)),
     (RE, "adaptive_avg_pool2d: elements of output_size must be greater than or equal to 0 but received {-1, 2}")),
    ("6.3-neg-avg3d", "adaptive_avg_pool3d", (1, 1, 5, 5, 5), dict(output_size=(-1, 2, 2)),
     (RE, "adaptive_avg_pool3d: elements of output_size must be greater than or equal to 0 but received {-1, 2,2}")),
    ("6.3-neg-avg1d", "adaptive_avg_pool1d", (1, 5), dict(output_size=-1),
     (RE, "adaptive_avg_pool2d: elements of output_size must be greater than or equal to 0 but received {1, -1}")),
    ("6.3-len-max", "adaptive_max_pool2d", (1, 1, 4, 4), dict(output_size=(3, 3, 3)),
     (RE, "adaptive_max_pool2d(): internal error: output_size.size() must be 2")),
    ("6.3-None-rank", "adaptive_avg_pool2d", (4, 8), dict(output_size=(None, 2)),
     ("ValueError", "Input dimension should be at least 3")),
    ("6.3-1d-None", "adaptive_max_pool1d", (1, 5), dict(output_size=(None,)),
     ("TypeError", "adaptive_max_pool1d(): argument 'output_size' (position 2) must be tuple of ints, but found "
                   "element of type NoneType at pos 0")),
    ("None-2d", "adaptive_avg_pool2d", (1, 1, 4, 4), dict(output_size=None),
     ("TypeError", "object of type 'NoneType' has no len()")),
    ("6.3-1d-empty", "adaptive_max_pool1d", (1, 2, 0), dict(output_size=2),
     (RE, "adaptive_max_pool1d(): Expected input to have non-zero size for non-batch dimensions, but input has "
          "sizes [1, 2, 0] with dimension 2 being empty")),
    # runtime ≠ spec text: AdaptiveAvgPool2d only checks the spatial dims, so C = 0 passes
    ("avg2d-C0", "adaptive_avg_pool2d", (1, 0, 8, 8), dict(output_size=2), (1, 0, 2, 2)),
]


@pytest.mark.parametrize("case_id, op, shape, params, expected", EDGE, ids=[e[0] for e in EDGE])
def test_edge_cases(case_id, op, shape, params, expected):
    assert_edge_case(check(op, shape, params), op, shape, params, expected)


@pytest.mark.parametrize("op, shape, params, match", [
    ("adaptive_avg_pool2d", (8, 8), dict(output_size=2), r"needs a 3-D or 4-D input, got 2-D"),
    ("adaptive_avg_pool2d", (1, 1, 8, 8), dict(output_size=(2, 2, 2)), r"output_size needs 2 entries"),
    ("adaptive_avg_pool2d", (1, 1, 8, 8), dict(output_size=(-1, 2)), r"entries must be ≥ 0"),
    ("adaptive_max_pool2d", (1, 1, 8, 8), dict(output_size=(-3, 2)), r"does not validate output_size"),
    ("adaptive_max_pool1d", (1, 1, 1, 8), dict(output_size=2), r"needs a 2-D \(C, L\) or 3-D \(N, C, L\) input"),
    ("adaptive_avg_pool3d", (1, 0, 4, 4, 4), dict(output_size=2), r"empty dim"),
    ("adaptive_avg_pool2d", (8,), dict(output_size=1), r"mean of the last 2 dims"),
])
def test_error_messages(op, shape, params, match):
    with pytest.raises(TorchWouldRaise, match=match) as info:
        output_shape(op, shape, **params)
    assert info.value.suggestions
    assert check(op, shape, params).message == info.value.torch_message


# --------------------------------------------------------------------------------------------
# the bins


def test_bins_e34_overlap():
    ex = explain("adaptive_avg_pool1d", (1, 1, 10), output_size=4)
    (note,) = [n for n in ex.notes if n.code == "bins-overlap"]
    assert note.dim == "L"
    assert note.data["bins"] == [(0, 3), (2, 5), (5, 8), (7, 10)]
    assert note.data["sizes"] == [3]
    assert "[0,3) [2,5) [5,8) [7,10)" in note.message
    (step,) = ex.steps
    assert (step.dim, step.input, step.output) == ("L", 10, 4)
    assert step.values["bins"] == [(0, 3), (2, 5), (5, 8), (7, 10)]


def test_bins_e35_repeat():
    ex = explain("adaptive_max_pool1d", (1, 1, 3), output_size=7)
    (note,) = [n for n in ex.notes if n.code == "bins-repeat"]
    assert [s for s, _ in note.data["bins"]] == [0, 0, 0, 1, 1, 2, 2]


def test_bins_equal_are_info_and_per_dim():
    ex = explain("adaptive_avg_pool2d", (1, 1, 8, 10), output_size=(4, 4))
    codes = {(n.dim, n.code) for n in ex.notes}
    assert codes == {("H", "info"), ("W", "bins-overlap")}
    assert [s.dim for s in ex.steps] == ["H", "W"]


def _bins_from_torch(L: int, O: int):
    """Which inputs each output reads: AdaptiveMaxPool1d on a batch of one-hot signals."""
    x = torch.eye(L).reshape(L, 1, L)
    hit = nn.AdaptiveMaxPool1d(O)(x)[:, 0, :] > 0  # hit[b, i]: output i saw pixel b
    bins = []
    for i in range(O):
        rows = [b for b in range(L) if hit[b, i]]
        bins.append((rows[0], rows[-1] + 1))
        assert rows == list(range(rows[0], rows[-1] + 1)), "bins are contiguous"
    return bins


@settings(max_examples=60, deadline=None, derandomize=True)
@given(L=st.integers(1, 20), O=st.integers(1, 20))
def test_bins_match_torch(L, O):
    (step,) = explain("adaptive_max_pool1d", (1, 1, L), output_size=O).steps
    assert step.values["bins"] == _bins_from_torch(L, O)


def test_none_step_says_it_keeps_the_input_size():
    ex = explain("adaptive_avg_pool2d", (1, 1, 10, 7), output_size=(4, None))
    assert [(s.dim, s.output, s.formula) for s in ex.steps] == [
        ("H", 4, "O (the requested output_size)"), ("W", 7, "L (None keeps the input size)")]

"""MaxPool / AvgPool / LPPool 1d/2d/3d shape arithmetic against the real torch modules.

Every case runs ``nn.<Pool>(**params)(torch.zeros(shape))`` on CPU and compares: the same shape,
or the same exception class and first message line (shape_rules.md §3–§5, §15).
"""

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
INF = float("inf")

CLASSES = {"max": "MaxPool{nd}d", "avg": "AvgPool{nd}d", "lp": "LPPool{nd}d"}


def run_torch(op: str, shape, params) -> Outcome:
    kind, nd = op.split("_")[0], int(op[-2])
    cls = getattr(nn, CLASSES[kind].format(nd=nd))
    return torch_outcome(lambda: cls(**params)(torch.zeros(shape)))


def check(op: str, shape, params) -> Outcome:
    theirs = run_torch(op, shape, params)
    assert_same_outcome(layerlab_outcome(op, shape, **params), theirs, f"{op}{tuple(shape)} {params}")
    return theirs


# --------------------------------------------------------------------------------------------
# property tests: random valid and invalid settings, every op


#: How a per-dim argument is written: mostly an int or an nd-tuple, rarely a tuple of the wrong length.
FORMS = ["int"] * 10 + ["tuple"] * 10 + ["one"] * 3 + ["bad"]


def _written(draw, values, nd: int):
    form = draw(st.sampled_from(FORMS))
    if form == "int":
        return values[0]
    if form == "tuple":
        return tuple(values)
    if form == "one":
        return (values[0],)
    n = draw(st.sampled_from([n for n in (0, 1, 2, 3, 4) if n not in (1, nd)]))
    return tuple((list(values) * 4)[:n])


@st.composite
def shapes(draw, nd: int):
    rank = draw(st.sampled_from([nd + 2] * 16 + [nd + 1] * 8 + [-1] * 2))
    if rank == -1:  # any rank, right or wrong
        rank = draw(st.integers(0, 6))
    dims = [draw(mostly(range(1, 17), [0])) for _ in range(rank)]
    if rank == nd + 2:
        dims[:2] = [draw(st.sampled_from([1, 1, 2, 0])), draw(mostly([1, 2], [0]))]
    elif rank == nd + 1:
        dims[0] = draw(mostly([1, 2], [0]))
    return tuple(dims)


@st.composite
def pool_cases(draw):
    kind = draw(st.sampled_from(["max", "avg", "lp"]))
    nd = draw(st.sampled_from([1, 2, 3]))
    ks = [draw(mostly([1, 2, 2, 3, 3, 4, 5], [0, -1])) for _ in range(nd)]
    params = dict(kernel_size=_written(draw, ks, nd), ceil_mode=draw(st.booleans()))
    if draw(st.booleans()):
        params["stride"] = None
    else:
        params["stride"] = _written(draw, [draw(mostly([1, 1, 2, 2, 3, 4], [0, -1])) for _ in range(nd)], nd)
    pads = [draw(mostly(range(0, max(k, 0) // 2 + 1), [max(k, 0) // 2 + 1, -1])) for k in ks]
    if kind == "max":
        params.update(padding=_written(draw, pads, nd),
                      dilation=_written(draw, [draw(mostly([1, 1, 1, 2, 3], [0])) for _ in range(nd)], nd),
                      return_indices=draw(st.booleans()))
    elif kind == "avg":
        params.update(padding=_written(draw, pads, nd), count_include_pad=draw(st.booleans()))
        if nd > 1:
            params["divisor_override"] = draw(mostly([None, None, 2], [0, -1]))
    else:
        params["norm_type"] = draw(mostly([1, 2, 3, INF, -INF], [0]))
    return f"{kind}_pool{nd}d", draw(shapes(nd)), params


@settings(max_examples=700, deadline=None, derandomize=True)
@given(pool_cases())
def test_pools_match_torch(case):
    op, shape, params = case
    check(op, shape, params)


# --------------------------------------------------------------------------------------------
# the edge cases of shape_rules.md §15, each with torch's answer written out

RE = "RuntimeError"
EDGE = [
    ("E02", "max_pool1d", (1, 1, 5), dict(kernel_size=2, stride=2), (1, 1, 2)),
    ("E03", "max_pool1d", (1, 1, 5), dict(kernel_size=2, stride=2, ceil_mode=True), (1, 1, 3)),
    ("E04", "max_pool1d", (1, 1, 5), dict(kernel_size=2, stride=2, padding=1, ceil_mode=True), (1, 1, 3)),
    ("E05", "max_pool2d", (1, 1, 3, 3), dict(kernel_size=2, stride=2, padding=1, ceil_mode=True), (1, 1, 2, 2)),
    ("E06", "max_pool1d", (1, 1, 4), dict(kernel_size=1, stride=2, ceil_mode=True), (1, 1, 2)),
    ("E07", "max_pool2d", (1, 1, 2, 2), dict(kernel_size=3, stride=2, ceil_mode=True), (1, 1, 1, 1)),
    ("E08", "max_pool2d", (1, 1, 2, 2), dict(kernel_size=3, stride=2),
     (RE, "Given input size: (1x2x2). Calculated output size: (1x0x0). Output size is too small")),
    ("E09", "max_pool1d", (1, 1, 8), dict(kernel_size=3, stride=2, padding=1, dilation=2, ceil_mode=True), (1, 1, 4)),
    ("E10", "max_pool2d", (1, 1, 8, 8), dict(kernel_size=2, dilation=3, padding=2),
     (RE, "pad should be smaller than or equal to half of kernel size, but got padW = 2, padH = 2, kW = 2, kH = 2")),
    ("E11", "max_pool2d", (1, 1, 8, 8), dict(kernel_size=3, stride=1, padding=2, dilation=2),
     (RE, "pad should be smaller than or equal to half of kernel size, but got padW = 2, padH = 2, kW = 3, kH = 3")),
    ("E12", "avg_pool2d", (1, 1, 2, 2), dict(kernel_size=3, padding=1), (1, 1, 1, 1)),
    ("E13", "avg_pool3d", (1, 1, 2, 2, 2), dict(kernel_size=3, padding=1),
     (RE, "input image (T: 2 H: 2 W: 2) smaller than kernel size (kT: 3 kH: 3 kW: 3)")),
    ("E14", "avg_pool3d", (1, 1, 3, 4, 4), dict(kernel_size=4, stride=2, ceil_mode=True),
     (RE, "input image (T: 3 H: 4 W: 4) smaller than kernel size (kT: 4 kH: 4 kW: 4)")),
    ("E14b", "max_pool3d", (1, 1, 3, 4, 4), dict(kernel_size=4, stride=2, ceil_mode=True), (1, 1, 1, 1, 1)),
    ("E15", "max_pool2d", (1, 1, 8, 8), dict(kernel_size=0), (RE, "stride should not be zero")),
    ("E41", "lp_pool1d", (1, 1, 8), dict(norm_type=2, kernel_size=(3,)),
     ("TypeError", "mul(): argument 'other' (position 1) must be Tensor, not tuple")),
    ("E41b", "lp_pool1d", (1, 1, 8), dict(norm_type=2, kernel_size=3), (1, 1, 2)),
    ("E42", "max_pool1d", (1, 1, 8), dict(kernel_size=2, padding=2, dilation=3),
     (RE, "max_pool1d() padding should be at most half of kernel size, but got padding=2 and kernel_size=2")),
    ("E43", "max_pool1d", (1, 1, 8), dict(kernel_size=2, padding=2, dilation=3, return_indices=True),
     (RE, "pad should be smaller than or equal to half of kernel size, but got padW = 2, padH = 0, kW = 2, kH = 1")),
    ("U1", "max_pool2d", (1, 8, 25, 25), dict(kernel_size=2), (1, 8, 12, 12)),
    # §3.1 worked examples
    ("3.1-e", "max_pool1d", (1, 1, 2), dict(kernel_size=3, stride=2, ceil_mode=True), (1, 1, 1)),
    ("3.1-f", "max_pool1d", (1, 1, 8), dict(kernel_size=3, stride=2, padding=1, dilation=2), (1, 1, 3)),
    # §5: LPPool2d/3d unpack kernel_size in Python
    ("5-2d", "lp_pool2d", (1, 1, 8, 8), dict(norm_type=2, kernel_size=(3,)),
     ("ValueError", "not enough values to unpack (expected 2, got 1)")),
    ("5-3d", "lp_pool3d", (1, 1, 8, 8, 8), dict(norm_type=2, kernel_size=(3, 3, 3, 3)),
     ("ValueError", "too many values to unpack (expected 3)")),
]


@pytest.mark.parametrize("case_id, op, shape, params, expected", EDGE, ids=[e[0] for e in EDGE])
def test_edge_cases(case_id, op, shape, params, expected):
    assert_edge_case(check(op, shape, params), op, shape, params, expected)


# --------------------------------------------------------------------------------------------
# error paths: messages are part of the contract


@pytest.mark.parametrize("op, shape, params, match, torch_says", [
    ("max_pool2d", (8, 8), dict(kernel_size=3), r"needs a 3-D .* or 4-D .* input, got 2-D",
     "non-empty 3D or 4D (batch mode) tensor expected for input"),
    ("max_pool2d", (1, 1, 8, 8), dict(kernel_size=(3, 3, 3)), r"kernel_size must be an int or a tuple of 2",
     "max_pool2d: kernel_size must either be a single int, or a tuple of two ints"),
    ("max_pool2d", (1, 1, 8, 8), dict(kernel_size=3, padding=-1), r"padding -1 is negative",
     "pad must be non-negative, but got pad: -1"),
    ("max_pool2d", (1, 1, 8, 8), dict(kernel_size=3, padding=2), r"padding 2 is more than half the effective kernel 3",
     "pad should be at most half of effective kernel size, but got pad=2, kernel_size=3 and dilation=1"),
    ("max_pool2d", (1, 1, 8, 8), dict(kernel_size=-1, stride=1), r"kernel_size must be ≥ 1",
     "kernel size should be greater than zero, but got kH: -1 kW: -1"),
    ("max_pool3d", (1, 0, 8, 8, 8), dict(kernel_size=3), r"empty channel or spatial dim",
     "max_pool3d_with_indices_out_cpu_template(): Expected input's non-batch dimensions to have positive length, "
     "but input has a shape of [1, 0, 8, 8, 8] and non-batch dimension 0 has length zero!"),
    ("max_pool1d", (8,), dict(kernel_size=3), r"MaxPool1d needs a 2-D \(C, L\) or 3-D \(N, C, L\) input, got 1-D",
     "max_pool1d: Expected 2D or 3D (batch mode) tensor with optional 0 dim batch size for input, but got:[8]"),
    ("max_pool1d", (1, 1, 2), dict(kernel_size=3), r"output would be empty",
     "max_pool1d() Invalid computed output size: 0"),
    ("avg_pool1d", (1, 1, 8), dict(kernel_size=(3, 3)), r"must be an int or a 1-tuple, got 2 values",
     "avg_pool1d() argument 'kernel_size' should contain one int (got 2)"),
    ("avg_pool1d", (1, 1, 2), dict(kernel_size=3), r"output would be empty in L",
     "Given input size: (1x1x2). Calculated output size: (1x1x0). Output size is too small"),
    ("avg_pool2d", (1, 1, 8, 8), dict(kernel_size=3, divisor_override=0), r"divisor_override=0",
     "divisor must be not zero"),
    ("avg_pool2d", (8, 8), dict(kernel_size=3), r"avg_pool2d needs a 3-D",
     "Dimension out of range (expected to be in range of [-2, 1], but got -3)"),
    # LPPool norm_type=0 depends on the torch version: tests/shapes/test_torch_versions.py
])
def test_error_messages(op, shape, params, match, torch_says):
    with pytest.raises(TorchWouldRaise, match=match) as info:
        output_shape(op, shape, **params)
    assert info.value.torch_message == torch_says
    assert info.value.suggestions, "every error proposes a fix"
    assert check(op, shape, params).message == torch_says


def test_error_keeps_steps_and_suggests_fixes():
    ex = explain("max_pool2d", (1, 1, 2, 2), kernel_size=3, stride=2)
    assert ex.error is not None and ex.output_shape is None
    assert [(s.dim, s.output) for s in ex.steps] == [("H", 0), ("W", 0)]
    assert "ceil_mode=True" in ex.error.suggestions
    assert "input ≥ 3 in every dim" in ex.error.suggestions
    ex = explain("max_pool2d", (1, 1, 8, 8), kernel_size=3, padding=2)
    assert ex.error.suggestions == ["padding ≤ 1 (= kernel_size // 2)"]


# --------------------------------------------------------------------------------------------
# steps and notes


def test_step_shows_formula_and_numbers():
    ex = explain("max_pool2d", (1, 3, 32, 32), kernel_size=3, stride=2, padding=1)
    h = ex.steps[0]
    assert (h.dim, h.input, h.output) == ("H", 32, 16)
    assert h.formula == "(L + 2p − E) // s + 1"
    assert h.substituted == "(32 + 2·1 − 3) // 2 + 1"
    assert h.values == {"k": 3, "s": 2, "p": 1, "d": 1, "E": 3, "ceil_mode": False}
    assert [s.dim for s in explain("avg_pool3d", (1, 1, 4, 4, 4), kernel_size=2).steps] == ["D", "H", "W"]
    assert [s.dim for s in explain("avg_pool1d", (1, 1, 4), kernel_size=2).steps] == ["L"]


def test_ceil_dropped_note_e04():
    ex = explain("max_pool1d", (1, 1, 5), kernel_size=2, stride=2, padding=1, ceil_mode=True)
    assert ex.output_shape == (1, 1, 3)
    (note,) = [n for n in ex.notes if n.code == "ceil-dropped"]
    assert note.data == {"naive": 4, "output": 3, "start": 6, "limit": 6}
    assert "right padding" in note.message and "drops it" in note.message
    assert ex.steps[0].values["naive"] == 4 and ex.steps[0].values["dropped"] is True
    assert not [n for n in ex.notes if n.code == "ceil-extra-window"]


def test_ceil_extra_window_note_e03():
    ex = explain("max_pool1d", (1, 1, 5), kernel_size=2, stride=2, ceil_mode=True)
    (note,) = [n for n in ex.notes if n.code == "ceil-extra-window"]
    assert note.data == {"window": 2, "start": 4, "past_end": 1}
    assert not [n for n in ex.notes if n.code in ("ceil-dropped", "cropped")]


def test_cropped_and_skipped_notes():
    ex = explain("max_pool1d", (1, 1, 10), kernel_size=2, stride=5)  # like E46: pixels 2-4, 7-9 unread
    notes = {n.code: n for n in ex.notes}
    # No third window could start inside the input (it would start at 10): every unread pixel is
    # a stride gap, none is cropped by the floor — the same classification as the conv notes.
    assert "cropped" not in notes
    assert notes["skipped"].data["pixels"] == [2, 3, 4, 7, 8, 9]
    assert "stride 5 > effective kernel 2" in notes["skipped"].message
    ex = explain("max_pool2d", (1, 1, 32, 31), kernel_size=3, stride=2)
    assert [(n.dim, n.data["pixels"]) for n in ex.notes if n.code == "cropped"] == [("H", [31])]


def _unread_from_notes(ex):
    lost = {}
    for n in ex.notes:
        if n.code in ("cropped", "skipped"):
            lost.setdefault(n.dim, set()).update(n.data["pixels"])
    return lost


def _zero_grad_positions_1d(op: str, L: int, params) -> set:
    """Real pixels whose gradient is zero (avg/lp pools), or that no max window sees (one-hot trick)."""
    if op.startswith("max"):
        # Batch of one-hot signals: pixel b is read iff its own 1.0 reaches some output max.
        x = torch.eye(L).reshape(L, 1, L).requires_grad_()
        nn.MaxPool1d(**params)(x).sum().backward()
        g = torch.diagonal(x.grad[:, 0, :])
    else:
        x = torch.rand(1, 1, L).add_(0.5).requires_grad_()
        cls = nn.AvgPool1d if op.startswith("avg") else nn.LPPool1d
        cls(**params)(x).sum().backward()
        g = x.grad[0, 0]
    return {i for i in range(L) if g[i] == 0}


@pytest.mark.parametrize("op, L, params", [
    ("avg_pool1d", 32, dict(kernel_size=3, stride=2)),
    ("avg_pool1d", 10, dict(kernel_size=2, stride=5)),
    ("avg_pool1d", 11, dict(kernel_size=4, stride=4, padding=1)),
    ("lp_pool1d", 13, dict(norm_type=2, kernel_size=3, stride=4)),
    ("max_pool1d", 12, dict(kernel_size=3, stride=3, dilation=2)),
    ("max_pool1d", 20, dict(kernel_size=3, stride=5, padding=1, dilation=3)),
    ("max_pool1d", 9, dict(kernel_size=2, stride=4, ceil_mode=True)),
])
def test_unread_pixels_match_zero_gradients(op, L, params):
    ex = explain(op, (1, 1, L), **params)
    assert ex.ok
    assert _unread_from_notes(ex).get("L", set()) == _zero_grad_positions_1d(op, L, params)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(L=st.integers(1, 24), k=st.integers(1, 5), s=st.integers(1, 7), p=st.integers(0, 2), d=st.integers(1, 3),
       ceil=st.booleans())
def test_unread_pixels_property(L, k, s, p, d, ceil):
    params = dict(kernel_size=k, stride=s, padding=min(p, k // 2), dilation=d, ceil_mode=ceil)
    ex = explain("max_pool1d", (1, 1, L), **params)
    if ex.ok:
        assert _unread_from_notes(ex).get("L", set()) == _zero_grad_positions_1d("max_pool1d", L, params)


def test_unread_pixels_2d_match_zero_gradients():
    params = dict(kernel_size=(3, 2), stride=(2, 3))
    ex = explain("avg_pool2d", (1, 1, 10, 11), **params)
    x = torch.rand(1, 1, 10, 11).requires_grad_()
    nn.AvgPool2d(**params)(x).sum().backward()
    zero = {(i, j) for i in range(10) for j in range(11) if x.grad[0, 0, i, j] == 0}
    lost = _unread_from_notes(ex)
    ours = {(i, j) for i in range(10) for j in range(11) if i in lost.get("H", ()) or j in lost.get("W", ())}
    assert ours == zero and zero


def test_huge_inputs_are_answered_without_enumerating_pixels():
    # 10⁹ pixels: the shape and the unread pixels come from the arithmetic (no per-pixel scan);
    # the first unread pixels are the same as torch's zero-gradient pixels on a short input.
    ex = explain("avg_pool1d", (1, 1, 10**9), kernel_size=2, stride=7)
    assert ex.output_shape[-1] == (10**9 - 2) // 7 + 1
    notes = {n.code: n for n in ex.notes}
    x = torch.rand(1, 1, 70).requires_grad_()
    nn.AvgPool1d(2, 7)(x).sum().backward()
    zero = [i for i in range(70) if x.grad[0, 0, i] == 0]
    assert notes["skipped"].data["pixels"][:len(zero)] == zero
    assert notes["skipped"].data["count"] == 10**9 - 2 * ex.output_shape[-1]

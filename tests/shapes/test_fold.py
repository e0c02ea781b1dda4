"""nn.Unfold / nn.Fold shape arithmetic against the real torch modules (shape_rules.md §7, §15)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from layerlab.errors import TorchWouldRaise
from layerlab.shapes import explain, output_shape
from layerlab.shapes.arith import conv_out
from tests.shapes.oracle import Outcome, assert_same_outcome, layerlab_outcome, torch_outcome
from tests.shapes.strategies import often

nn = torch.nn


def check(op: str, shape, **params) -> Outcome:
    cls = nn.Unfold if op == "unfold" else nn.Fold
    theirs = torch_outcome(lambda: cls(**params)(torch.zeros(shape)))
    assert_same_outcome(layerlab_outcome(op, shape, **params), theirs, f"{op}{tuple(shape)} {params}")
    return theirs


def _pair(draw, values):
    form = draw(st.sampled_from(["int"] * 6 + ["pair"] * 5 + ["one", "three"]))
    if form == "int":
        return draw(values)
    n = {"pair": 2, "one": 1, "three": 3}[form]
    return tuple(draw(values) for _ in range(n))


def _arg_sets(draw):
    return dict(
        kernel_size=_pair(draw, often([1, 2, 3, 4], [0, -1])),
        dilation=_pair(draw, often([1, 1, 2], [0])),
        padding=_pair(draw, often([0, 0, 1, 2], [-1])),
        stride=_pair(draw, often([1, 1, 2, 3], [0])),
    )


@st.composite
def unfold_cases(draw):
    params = _arg_sets(draw)
    batch = draw(st.sampled_from([None, 0, 1, 2]))
    shape = ([] if batch is None else [batch]) + [draw(often([1, 2, 3], [0]))]
    shape += [draw(st.integers(0, 9)) for _ in range(2)]
    rank = draw(st.sampled_from(["ok"] * 20 + ["2d", "1d", "0d", "5d"]))
    if rank == "2d":
        shape = shape[-2:]
    elif rank == "1d":
        shape = shape[-1:]
    elif rank == "0d":
        shape = []
    elif rank == "5d":
        shape = [1] + shape
    return tuple(shape), params


@settings(max_examples=200, deadline=None, derandomize=True)
@given(unfold_cases())
def test_unfold_matches_torch(case):
    shape, params = case
    theirs = check("unfold", shape, **params)
    event(f"torch raises {theirs.exc}" if theirs.raised else "torch returns a shape")


@st.composite
def fold_cases(draw):
    params = _arg_sets(draw)
    out = tuple(draw(often(range(1, 11), [-1, 0])) for _ in range(2))
    params["output_size"] = draw(st.sampled_from([out, out, out, out[0], out + (4,)]))
    k = params["kernel_size"]
    kk = (k * k) if isinstance(k, int) else (k[0] * k[-1])
    channels = max(draw(often([1, 2], [0])) * kk + draw(often([0], [1])), 0)
    try:  # the block count the output size gives, when the arguments make sense
        kt, dt, pt, stt = ((v, v) if isinstance(v, int) else v for v in (k, params["dilation"], params["padding"],
                                                                         params["stride"]))
        blocks = conv_out(out[0], kt[0], stt[0], pt[0], dt[0]) * conv_out(out[1], kt[1], stt[1], pt[1], dt[1])
    except (ZeroDivisionError, IndexError):
        blocks = 4
    length = max(draw(often([blocks], [blocks + 1, 0])), 0)  # torch.zeros needs sizes ≥ 0
    batch = draw(st.sampled_from([None, 0, 1, 2]))
    shape = ([] if batch is None else [batch]) + [channels, length]
    if draw(st.integers(0, 20)) == 0:
        shape = draw(st.sampled_from([[], [channels], [1, 1, channels, length]]))
    return tuple(shape), params


@settings(max_examples=200, deadline=None, derandomize=True)
@given(fold_cases())
def test_fold_matches_torch(case):
    shape, params = case
    theirs = check("fold", shape, **params)
    event(f"torch raises {theirs.exc}" if theirs.raised else "torch returns a shape")


# --------------------------------------------------------------------------------------------
# edge cases and error paths

def test_e49_unfold():
    theirs = check("unfold", (2, 3, 7, 9), kernel_size=3, padding=1, stride=2)
    assert theirs.shape == (2, 27, 20)  # blocks 4 × 5 = 20, each C·k·k = 27 values
    ex = explain("unfold", (2, 3, 7, 9), kernel_size=3, padding=1, stride=2)
    assert [(s.dim, s.output) for s in ex.steps] == [("H", 4), ("W", 5), ("C", 27), ("L", 20)]


@pytest.mark.parametrize("op,shape,params,exc,message", [
    ("unfold", (1, 1, 4, 6), dict(kernel_size=5), "RuntimeError",
     "Given input with spatial size (4, 6), kernel_size=(5, 5), dilation=(1, 1), padding=(0, 0), calculated shape "
     "of the array of sliding blocks as (0, 2), but its components must be at least one."),
    ("unfold", (1, 0, 5, 5), dict(kernel_size=3), "RuntimeError",
     "Expected 3D or 4D (batch mode) tensor with possibly 0 batch size and other non-zero dimensions for input, "
     "but got: [1, 0, 5, 5]"),
    ("unfold", (5, 5), dict(kernel_size=3), "IndexError",
     "Dimension out of range (expected to be in range of [-2, 1], but got 2)"),
    ("unfold", (1, 1, 5, 5), dict(kernel_size=(3, 3, 3)), "RuntimeError",
     "It is expected kernel_size equals to 2, but got size 3"),
    ("fold", (1, 25, 12), dict(output_size=(4, 5), kernel_size=(3, 4)), "RuntimeError",
     "Expected size of input's dimension 1 to be divisible by the product of kernel_size, but got input.size(1)=25 "
     "and kernel_size=(3, 4)."),
    ("fold", (9, 85), dict(output_size=(15, 32), kernel_size=3, dilation=2, stride=2), "RuntimeError",
     "Given output_size=(15, 32), kernel_size=(3, 3), dilation=(2, 2), padding=(0, 0), stride=(2, 2), expected "
     "size of input's dimension 2 to match the calculated number of sliding blocks 6 * 14 = 84, but got "
     "input.size(2)=85."),
    ("fold", (1, 9, 9), dict(output_size=(-1, -1), kernel_size=3), "RuntimeError",
     "Given output_size=(-1, -1), kernel_size=(3, 3), dilation=(1, 1), padding=(0, 0), stride=(1, 1), calculated "
     "shape of the array of sliding blocks as (-3, -3), which is too small (non-positive)"),
    ("fold", (1, 12, 12), dict(output_size=(4, 5), kernel_size=1, stride=0, dilation=0), "RuntimeError",
     "stride should be greater than zero, but got stride_height: 0 stride_width: 0"),
])
def test_edge_errors(op, shape, params, exc, message):
    theirs = check(op, shape, **params)
    assert (theirs.exc, theirs.message) == (exc, message)
    with pytest.raises(TorchWouldRaise) as info:
        output_shape(op, shape, **params)
    assert (info.value.torch_exception, info.value.torch_message) == (exc, message)


def test_fold_shapes():
    assert check("fold", (1, 12, 12), output_size=(4, 5), kernel_size=2).shape == (1, 3, 4, 5)
    assert check("fold", (12, 12), output_size=(4, 5), kernel_size=2).shape == (3, 4, 5)
    ex = explain("fold", (1, 12, 12), output_size=(4, 5), kernel_size=2)
    assert any("SUMS" in n.message for n in ex.notes)


def test_unfold_blocks_error_suggests_a_fit():
    with pytest.raises(TorchWouldRaise, match="does not fit") as info:
        output_shape("unfold", (1, 1, 4, 6), kernel_size=5)
    assert info.value.suggestions == ["padding=(1, 0)", "kernel_size ≤ (4, 6)"]
    assert check("unfold", (1, 1, 4, 6), kernel_size=5, padding=(1, 0)).shape == (1, 25, 4)


def test_unfold_cropped_note():
    ex = explain("unfold", (1, 1, 32, 32), kernel_size=3, stride=2)
    assert [n.data["pixels"] for n in ex.notes if n.code == "cropped"] == [[31], [31]]

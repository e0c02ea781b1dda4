"""Conv1d / Conv2d / Conv3d shape arithmetic against the real torch modules (shape_rules.md §1, §15).

Every case builds ``nn.ConvNd(...)`` and runs it on ``torch.zeros(shape)`` (CPU, one thread, the
oracle's settings): the same shape, or the same exception class and first message line — the
backend-dependent messages of §1.7 (kernel 0, dilation 0, empty spatial input) included.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from layerlab.errors import TorchWouldRaise
from layerlab.shapes import explain, output_shape
from tests.shapes.oracle import Outcome, assert_same_outcome, layerlab_outcome, normalise_message, torch_outcome
from tests.shapes.strategies import often, per_dim

nn = torch.nn
PARAMS = ("stride", "padding", "dilation", "groups", "padding_mode")


def run_torch(nd: int, shape, in_channels: int, out_channels: int, **kw) -> Outcome:
    cls = getattr(nn, f"Conv{nd}d")
    return torch_outcome(lambda: cls(in_channels, out_channels, **kw)(torch.zeros(shape)))


def check(nd: int, shape, **params) -> Outcome:
    """Compare layerlab with torch; ``in_channels``/``out_channels`` default as layerlab's do."""
    in_ch = params.get("in_channels")
    if in_ch is None:
        in_ch = shape[-nd - 1] if len(shape) >= nd + 1 else 1
    out_ch = params.get("out_channels")
    out_ch = in_ch if out_ch is None else out_ch
    kw = {k: v for k, v in params.items() if k not in ("in_channels", "out_channels")}
    theirs = run_torch(nd, shape, in_ch, out_ch, **kw)
    ours = layerlab_outcome(f"conv{nd}d", shape, **params)
    assert_same_outcome(ours, theirs, f"conv{nd}d{tuple(shape)} {params}")
    return theirs


# --------------------------------------------------------------------------------------------
# property tests

@st.composite
def conv_cases(draw):
    nd = draw(st.sampled_from([1, 2, 3]))
    groups = draw(often([1, 1, 1, 2], [0, -1, 3]))
    channels = draw(often([1, 2, 3], [0])) * max(groups, 1)
    hi = 5 if nd == 3 else 9
    if draw(st.integers(0, 15)) == 0:  # large enough for oneDNN's "big input" rule
        spatial = [draw(st.integers(40, 150)) for _ in range(nd)] if nd < 3 else [draw(st.integers(12, 26))] * 3
    else:
        spatial = [draw(st.integers(0, hi)) for _ in range(nd)]
    batch = draw(st.sampled_from([None, 0, 1, 1, 2]))
    shape = ([] if batch is None else [batch]) + [channels] + spatial
    rank = draw(st.sampled_from(["ok"] * 25 + ["drop", "extra"]))
    if rank == "drop":
        shape = shape[1:]
    elif rank == "extra":
        shape = [1] + shape
    params = dict(
        in_channels=draw(often([channels], [0, 2, 4])),
        out_channels=draw(often([1, 2, 3], [0, 5])) * max(groups, 1),
        kernel_size=per_dim(draw, nd, often([1, 2, 3, 4, 5], [0])),
        stride=per_dim(draw, nd, often([1, 1, 1, 2, 3], [0, -1])),
        dilation=per_dim(draw, nd, often([1, 1, 2, 3], [0, -1])),
        groups=groups,
        padding_mode=draw(often(["zeros"] * 5 + ["reflect", "replicate", "circular"], ["mirror"])),
    )
    kind = draw(st.sampled_from(["int"] * 6 + ["same", "same", "valid", "bad", "neg"]))
    if kind == "int":
        params["padding"] = per_dim(draw, nd, st.integers(0, 3))
    elif kind == "neg":
        params["padding"] = per_dim(draw, nd, st.integers(-2, 1))
    elif kind == "bad":
        params["padding"] = draw(st.sampled_from(["full", "Same"]))
    else:
        params["padding"] = kind
    return nd, tuple(shape), params


@settings(max_examples=400, deadline=None, derandomize=True)
@given(conv_cases())
def test_conv_matches_torch(case):
    nd, shape, params = case
    theirs = check(nd, shape, **params)
    event(f"torch raises {theirs.exc}" if theirs.raised else "torch returns a shape")
    if not theirs.raised:
        ex = explain(f"conv{nd}d", shape, **params)
        # the per-dim steps agree with the shape torch returned
        assert [s.output for s in ex.steps] == list(theirs.shape[-nd:])


@settings(max_examples=120, deadline=None, derandomize=True)
@given(nd=st.sampled_from([1, 2, 3]), batch=st.sampled_from([None, 1, 2]), data=st.data())
def test_valid_settings_give_torch_shape(nd, batch, data):
    """Valid settings only: the shape (and the per-dim steps) must be torch's."""
    k = tuple(data.draw(st.integers(1, 5)) for _ in range(nd))
    d = tuple(data.draw(st.integers(1, 3)) for _ in range(nd))
    s = tuple(data.draw(st.integers(1, 4)) for _ in range(nd))
    padding = data.draw(st.sampled_from(["int", "int", "same", "valid"]))
    if padding == "int":
        padding = tuple(data.draw(st.integers(0, 3)) for _ in range(nd))
    elif padding == "same":
        s = (1,) * nd
    mode = data.draw(st.sampled_from(["zeros", "zeros", "replicate", "circular"]))
    eff = [di * (ki - 1) + 1 for ki, di in zip(k, d)]
    spatial = [data.draw(st.integers(max(e, 3), e + 12)) for e in eff]  # ≥ 3: circular pads ≤ L
    groups = data.draw(st.sampled_from([1, 1, 2]))
    shape = ([] if batch is None else [batch]) + [2 * groups] + spatial
    params = dict(out_channels=3 * groups, kernel_size=k, stride=s, padding=padding, dilation=d, groups=groups,
                  padding_mode=mode)
    theirs = check(nd, tuple(shape), **params)
    assert not theirs.raised
    ex = explain(f"conv{nd}d", tuple(shape), **params)
    assert [step.output for step in ex.steps] == list(theirs.shape[-nd:])


# --------------------------------------------------------------------------------------------
# shape_rules.md §15 edge cases: torch's answer, and the expected value written out

EDGE_OK = [
    ("E01", 2, (1, 3, 32, 32), dict(out_channels=8, kernel_size=3, stride=2), (1, 8, 15, 15)),
    ("E16", 1, (1, 1, 5), dict(kernel_size=4, padding="same"), (1, 1, 5)),
    ("E17", 2, (1, 1, 3, 3), dict(kernel_size=10, padding="same"), (1, 1, 3, 3)),
    ("E45", 2, (1, 1, 3, 3), dict(kernel_size=1, padding=3, padding_mode="circular"), (1, 1, 9, 9)),
    ("E46", 1, (1, 1, 10), dict(kernel_size=2, stride=5), (1, 1, 2)),
    ("E47", 2, (1, 0, 4, 4), dict(in_channels=0, out_channels=2, kernel_size=1), (1, 0, 4, 4)),
    ("replicate-no-limit", 2, (1, 1, 3, 3), dict(kernel_size=1, padding=10, padding_mode="replicate"),
     (1, 1, 23, 23)),
    ("batch-0", 2, (0, 1, 8, 8), dict(out_channels=2, kernel_size=3), (0, 2, 6, 6)),
    ("unbatched", 3, (2, 5, 6, 7), dict(out_channels=4, kernel_size=(1, 2, 3), padding=(0, 1, 1)), (4, 5, 7, 7)),
]


@pytest.mark.parametrize("eid,nd,shape,params,expected", EDGE_OK, ids=[e[0] for e in EDGE_OK])
def test_edge_shapes(eid, nd, shape, params, expected):
    theirs = check(nd, shape, **params)
    assert theirs.shape == expected
    assert output_shape(f"conv{nd}d", shape, **params) == expected


EDGE_RAISE = [
    ("E18", 2, (1, 1, 8, 8), dict(kernel_size=3, stride=2, padding="same"), "ValueError",
     "padding='same' is not supported for strided convolutions"),
    ("E44", 2, (1, 1, 3, 3), dict(kernel_size=1, padding=3, padding_mode="reflect"), "RuntimeError",
     "Argument #4: Padding size should be less than the corresponding input dimension, but got: padding (3, 3) "
     "at dimension 3 of input [1, 1, 3, 3]"),
    ("kernel-too-big", 2, (1, 3, 4, 4), dict(kernel_size=5, dilation=2, padding=(1, 0)), "RuntimeError",
     "Calculated padded input size per channel: (6 x 4). Kernel size: (9 x 9). Kernel size can't be greater "
     "than actual input size"),
    ("kernel-too-big-1d", 1, (1, 1, 4), dict(kernel_size=5), "RuntimeError",
     "Calculated padded input size per channel: (4). Kernel size: (5). Kernel size can't be greater than actual "
     "input size"),
    ("channels", 2, (1, 3, 4, 4), dict(in_channels=4, out_channels=2, kernel_size=3, groups=2), "RuntimeError",
     "Given groups=2, weight of size [2, 2, 3, 3], expected input[1, 3, 4, 4] to have 4 channels, but got 3 "
     "channels instead"),
    ("channels-unbatched-reflect", 2, (3, 4, 4),
     dict(in_channels=4, out_channels=2, kernel_size=3, groups=2, padding=1, padding_mode="reflect"),
     "RuntimeError", "Given groups=2, weight of size [2, 2, 3, 3], expected input[1, 3, 6, 6] to have 4 "
     "channels, but got 3 channels instead"),
    ("groups-0", 2, (1, 4, 8, 8), dict(kernel_size=3, groups=0), "ValueError", "groups must be a positive integer"),
    ("in-divisible", 2, (1, 3, 8, 8), dict(out_channels=4, kernel_size=3, groups=2), "ValueError",
     "in_channels must be divisible by groups"),
    ("out-divisible", 2, (1, 4, 8, 8), dict(out_channels=3, kernel_size=3, groups=2), "ValueError",
     "out_channels must be divisible by groups"),
    ("padding-string", 2, (1, 1, 8, 8), dict(kernel_size=3, padding="full"), "ValueError",
     "Invalid padding string 'full', should be one of {'same', 'valid'}"),
    ("padding-mode", 2, (1, 1, 8, 8), dict(kernel_size=3, padding_mode="x"), "ValueError",
     "padding_mode must be one of {'circular', 'reflect', 'replicate', 'zeros'}, but got padding_mode='x'"),
    ("rank", 2, (4, 4), dict(in_channels=4, out_channels=2, kernel_size=3), "RuntimeError",
     "Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input of size: [4, 4]"),
    ("rank-reflect", 2, (1, 4, 4, 4, 4), dict(in_channels=4, kernel_size=3, padding=1, padding_mode="reflect"),
     "NotImplementedError", "Padding size 4 is not supported for 5D input tensor."),
    ("circular-wrap", 2, (1, 1, 3, 3), dict(kernel_size=1, padding=4, padding_mode="circular"), "RuntimeError",
     "Padding value causes wrapping around more than once."),
    ("negative-padding", 2, (1, 1, 4, 4), dict(kernel_size=1, padding=-1), "RuntimeError",
     "negative padding is not supported"),
    ("stride-0", 2, (1, 1, 4, 4), dict(kernel_size=1, stride=0), "RuntimeError",
     "non-positive stride is not supported"),
    ("tuple-length", 2, (1, 1, 4, 4), dict(kernel_size=3, stride=(1, 1, 1)), "RuntimeError",
     "expected stride to be a single integer value or a list of 2 values to match the convolution dimensions, "
     "but got stride=[1, 1, 1]"),
    # §1.7: backend-dependent wording (one thread; batch as given)
    ("dilation-0-N1", 2, (1, 1, 5, 5), dict(kernel_size=3, dilation=0), "RuntimeError",
     "dilation should be greater than zero, but got [0, 0]"),
    ("dilation-0-N2", 2, (2, 1, 5, 5), dict(kernel_size=3, dilation=0), "RuntimeError",
     "non-positive dilation is not supported"),
    ("kernel-0-N1", 2, (1, 1, 5, 5), dict(kernel_size=0), "RuntimeError",
     "kernel size should be greater than zero, but got kernel_height: 0 kernel_width: 0"),
    ("kernel-0-N2", 2, (2, 1, 5, 5), dict(kernel_size=0), "RuntimeError",
     "could not create a primitive descriptor for the convolution forward propagation primitive. Run workload "
     "with environment variable ONEDNN_VERBOSE=all to get additional diagnostic information."),
    ("empty-spatial-1d", 1, (1, 1, 0), dict(out_channels=2, kernel_size=1, padding=1), "RuntimeError",
     "Only zero batch or zero channel inputs are supported, but got input shape: [1, 1, 1, 0]"),
]


@pytest.mark.parametrize("eid,nd,shape,params,exc,message", EDGE_RAISE, ids=[e[0] for e in EDGE_RAISE])
def test_edge_errors(eid, nd, shape, params, exc, message):
    theirs = check(nd, shape, **params)
    assert (theirs.exc, normalise_message(theirs.message)) == (exc, message)
    with pytest.raises(TorchWouldRaise) as info:
        output_shape(f"conv{nd}d", shape, **params)
    assert info.value.torch_exception == exc
    assert info.value.torch_message == message


def test_e19_functional_same_strided():
    """E19: F.conv2d words E18 as a RuntimeError. layerlab models the module (ValueError at
    construction, E18) and says so in the hint."""
    theirs = torch_outcome(lambda: torch.nn.functional.conv2d(
        torch.zeros(1, 1, 8, 8), torch.zeros(1, 1, 3, 3), stride=2, padding="same"))
    assert (theirs.exc, theirs.message) == ("RuntimeError", "padding='same' is not supported for strided convolutions")
    with pytest.raises(TorchWouldRaise) as info:
        output_shape("conv2d", (1, 1, 8, 8), kernel_size=3, stride=2, padding="same")
    assert (info.value.torch_exception, info.value.torch_message) == ("ValueError", theirs.message)
    assert "F.conv2d raises RuntimeError" in info.value.hint


# --------------------------------------------------------------------------------------------
# error paths: structured fields

def test_kernel_too_big_suggests_the_fit():
    with pytest.raises(TorchWouldRaise, match="does not fit") as info:
        output_shape("conv2d", (1, 1, 4, 4), kernel_size=7)
    err = info.value
    assert err.rule == "§1.1"
    assert "kernel_size ≤ 4" in err.suggestions
    assert "padding=2" in err.suggestions
    assert "padding='same'" in err.suggestions


def test_channel_mismatch_names_the_channels():
    with pytest.raises(TorchWouldRaise, match="built for 4 input channels but the input has 3") as info:
        output_shape("conv2d", (1, 3, 8, 8), in_channels=4, out_channels=8, kernel_size=3)
    assert info.value.where == "C"
    assert info.value.suggestions == ["in_channels=3"]


def test_same_with_stride_suggests_tf_padding():
    with pytest.raises(TorchWouldRaise, match="stride > 1") as info:
        output_shape("conv2d", (1, 1, 224, 224), kernel_size=3, stride=2, padding="same")
    assert info.value.torch_exception == "ValueError"
    assert info.value.suggestions[0] == "stride=1"
    assert info.value.suggestions[1].startswith("padding=1")  # §14.2: 224, k=3, s=2 → p=1


def test_reflect_limit_suggests_smaller_padding():
    with pytest.raises(TorchWouldRaise, match="reflect padding must be smaller") as info:
        output_shape("conv2d", (1, 1, 3, 3), kernel_size=1, padding=3, padding_mode="reflect")
    assert "padding ≤ 2" in info.value.suggestions


def test_groups_suggestions_are_valid():
    with pytest.raises(TorchWouldRaise, match="not a multiple of groups") as info:
        output_shape("conv2d", (1, 6, 8, 8), out_channels=4, kernel_size=3, groups=4)
    for text in info.value.suggestions:
        g = int(text.split("=")[1])
        assert 6 % g == 0 and 4 % g == 0


def test_steps_before_an_error_are_kept():
    ex = explain("conv2d", (1, 1, 4, 4), kernel_size=7)
    assert ex.error is not None and ex.output_shape is None
    assert [s.output for s in ex.steps] == [-2, -2]
    assert ex.steps[0].substituted == "(4 + 2·0 − 7) // 1 + 1"


# --------------------------------------------------------------------------------------------
# notes

def _zero_grad_positions(nd: int, shape, **params):
    """Input positions (last dim) that receive no gradient: the pixels no window reads."""
    in_ch = shape[-nd - 1]
    conv = getattr(nn, f"Conv{nd}d")(in_ch, 1, **params)
    with torch.no_grad():
        conv.weight.fill_(1.0)
    x = torch.zeros(shape, requires_grad=True)
    conv(x).sum().backward()
    g = x.grad.abs().reshape(-1, shape[-1]).sum(0)
    return [i for i, v in enumerate(g.tolist()) if v == 0]


def test_cropped_names_pixel_31():
    ex = explain("conv2d", (1, 3, 32, 32), out_channels=8, kernel_size=3, stride=2)
    cropped = [n for n in ex.notes if n.code == "cropped"]
    assert [n.dim for n in cropped] == ["H", "W"]
    assert cropped[0].data["pixels"] == [31]
    assert "31" in cropped[0].message
    assert _zero_grad_positions(2, (1, 3, 32, 32), kernel_size=3, stride=2) == [31]


def test_skipped_pixels_match_autograd():
    ex = explain("conv1d", (1, 1, 10), kernel_size=2, stride=5)
    skipped = [n for n in ex.notes if n.code == "skipped"]
    assert len(skipped) == 1 and not [n for n in ex.notes if n.code == "cropped"]
    assert skipped[0].data["pixels"] == [2, 3, 4, 7, 8, 9]
    assert "2-4, 7-9" in skipped[0].message
    assert _zero_grad_positions(1, (1, 1, 10), kernel_size=2, stride=5) == [2, 3, 4, 7, 8, 9]


@settings(max_examples=120, deadline=None, derandomize=True)
@given(L=st.integers(1, 30), k=st.integers(1, 5), s=st.integers(1, 6),
       p=st.one_of(st.integers(0, 2), st.just("same")), d=st.integers(1, 3),
       mode=st.sampled_from(["zeros", "zeros", "replicate", "reflect", "circular"]))
def test_unread_notes_match_autograd(L, k, s, p, d, mode):
    """``cropped`` + ``skipped`` list exactly the input pixels whose gradient is 0."""
    if p == "same":
        s, most = 1, d * (k - 1) - d * (k - 1) // 2
    else:
        most = p
        if L + 2 * p < d * (k - 1) + 1:
            return
    if (mode == "reflect" and most >= L) or (mode == "circular" and most > L):
        return
    ex = explain("conv1d", (1, 1, L), kernel_size=k, stride=s, padding=p, dilation=d, padding_mode=mode)
    noted = sorted(x for n in ex.notes if n.code in ("cropped", "skipped") for x in n.data["pixels"])
    assert noted == _zero_grad_positions(1, (1, 1, L), kernel_size=k, stride=s, padding=p, dilation=d,
                                         padding_mode=mode)


def test_even_kernel_same_is_asymmetric():
    ex = explain("conv1d", (1, 1, 5), kernel_size=4, padding="same")
    (note,) = [n for n in ex.notes if n.code == "same-asymmetric"]
    assert note.data == {"left": 1, "right": 2, "total": 3}
    assert "END" in note.message
    # torch agrees: an impulse weight [1, 0, 0, 0] shifts [1..5] right by one (left pad 1)
    conv = nn.Conv1d(1, 1, 4, padding="same", bias=False)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([[[1.0, 0, 0, 0]]]))
        out = conv(torch.arange(1.0, 6.0).reshape(1, 1, 5))
    assert out.flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_odd_kernel_same_has_no_asymmetry_note():
    ex = explain("conv2d", (1, 1, 8, 8), kernel_size=3, padding="same")
    assert not [n for n in ex.notes if n.code == "same-asymmetric"]
    assert ex.output_shape == (1, 1, 8, 8)


def test_zero_channels_note():
    ex = explain("conv2d", (1, 0, 4, 4), in_channels=0, out_channels=2, kernel_size=1)
    assert ex.output_shape == (1, 0, 4, 4)
    assert any("0 channels" in n.message for n in ex.notes)


def test_defaults_take_channels_from_the_input():
    assert output_shape("conv2d", (2, 5, 9, 9), kernel_size=3) == (2, 5, 7, 7)
    assert output_shape("conv2d", (2, 5, 9, 9), kernel_size=3, out_channels=7) == (2, 7, 7, 7)

"""layerlab.layers.pool against torch.nn.MaxPool1d/2d and AvgPool1d/2d."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

from layerlab.layers.pool import AvgPool1d, AvgPool2d, MaxPool1d, MaxPool2d, avg_pool_counts, pool_output_size
from tests.layers._spatial_checks import (
    F64, assert_compiles, assert_gradcheck, assert_parity, assert_shape_op, assert_traces, randn,
)

MAX = {1: (MaxPool1d, nn.MaxPool1d), 2: (MaxPool2d, nn.MaxPool2d)}
AVG = {1: (AvgPool1d, nn.AvgPool1d), 2: (AvgPool2d, nn.AvgPool2d)}


def per_dim(draw, nd, strategy):
    return draw(st.tuples(*[strategy] * nd))


@st.composite
def pool_cases(draw, kind):
    nd = draw(st.sampled_from([1, 2]))
    kernel = per_dim(draw, nd, st.integers(1, 4))
    args = dict(kernel_size=kernel, ceil_mode=draw(st.booleans()),
                stride=draw(st.one_of(st.none(), st.tuples(*[st.integers(1, 3)] * nd))),
                padding=tuple(draw(st.integers(0, k // 2)) for k in kernel))
    if kind == "max":
        args.update(dilation=per_dim(draw, nd, st.integers(1, 2)), return_indices=draw(st.booleans()))
    else:
        args.update(count_include_pad=draw(st.booleans()))
        if nd == 2:
            args.update(divisor_override=draw(st.one_of(st.none(), st.integers(1, 5))))
    # sizes down to 1: small inputs exercise ceil mode, and "output too small" must match torch
    size = per_dim(draw, nd, st.integers(1, 9))
    batch = (2,) if draw(st.booleans()) else ()
    return nd, args, (*batch, 2, *size)


def run_case(table, nd, args, shape):
    ours_cls, torch_cls = table[nd]
    ref = torch_cls(**args)
    ours = ours_cls.from_torch(ref)
    x = randn(*shape)
    try:
        out = ref(x)
    except RuntimeError:  # torch refuses (output < 1): we must refuse too, with a ValueError
        with pytest.raises(ValueError, match="at least one window along every spatial dim"):
            ours(x)
        return
    values = out[0] if isinstance(out, tuple) else out
    if torch.isinf(values).any():
        # a dilated window whose taps all miss the input: torch gives −inf (and a stray gradient); we refuse
        with pytest.raises(ValueError, match="reads only padding"):
            ours(x)
        return
    assert_parity(ours, ref, x)


@settings(max_examples=60, deadline=None)
@given(pool_cases("max"))
@example((2, dict(kernel_size=(3, 2), stride=(2, 2), padding=(1, 1), dilation=(2, 1), ceil_mode=True,
                  return_indices=True), (2, 2, 8, 5)))
def test_max_pool_parity_with_torch(case):
    run_case(MAX, *case)


@settings(max_examples=60, deadline=None)
@given(pool_cases("avg"))
@example((2, dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False,
                  divisor_override=None), (2, 2, 6, 7)))
@example((1, dict(kernel_size=4, stride=3, padding=2, ceil_mode=True, count_include_pad=True), (2, 2, 8)))
def test_avg_pool_parity_with_torch(case):
    run_case(AVG, *case)


@pytest.mark.parametrize("size, k, s, p, d, ceil", [
    (5, 2, 2, 0, 1, True), (5, 2, 2, 1, 1, True), (3, 2, 2, 1, 1, True), (4, 1, 2, 0, 1, True),
    (2, 3, 2, 0, 1, True), (8, 3, 2, 1, 2, True), (8, 3, 2, 1, 2, False), (32, 3, 2, 0, 1, False),
])
def test_output_size_matches_torch_including_the_ceil_mode_drop(size, k, s, p, d, ceil):
    expected = nn.MaxPool1d(k, s, p, d, ceil_mode=ceil)(torch.zeros(1, 1, size)).shape[-1]
    assert pool_output_size(size, k, s, p, d, ceil) == expected


def test_avg_divisor_counts_padding_or_not():
    # L=5, k=3, s=2, p=1, ceil → 3 windows: [−1, 2) [1, 4) [3, 6)
    assert avg_pool_counts(5, 3, 2, 1, 3, count_include_pad=True) == [3, 3, 3]
    assert avg_pool_counts(5, 3, 2, 1, 3, count_include_pad=False) == [2, 3, 2]
    # ceil-mode window past the padded end: L=6, k=3, s=2, p=0 → windows [0,3) [2,5) [4,7)→[4,6)
    assert avg_pool_counts(6, 3, 2, 0, 3, count_include_pad=True) == [3, 3, 2]


def test_a_window_of_only_padding_is_refused_where_torch_returns_minus_inf():
    ref = nn.MaxPool2d((1, 2), padding=(0, 1), dilation=(1, 2))
    x = torch.randn(2, 1, 1)
    assert torch.isinf(ref(x)).all()
    with pytest.raises(ValueError, match=r"MaxPool2d: input: expected every window to read at least one input "
                       r"pixel, got window 0 along W reads only padding \(taps \[-1, 1\], input size 1\)"):
        MaxPool2d.from_torch(ref)(x)


def test_ties_send_the_gradient_to_the_first_maximum_like_torch():
    x = torch.zeros(1, 1, 5, 5, dtype=F64)  # every window is one big tie
    ref = nn.MaxPool2d(3, stride=1, padding=1, return_indices=True)
    assert_parity(MaxPool2d.from_torch(ref), ref, x)


@pytest.mark.parametrize("make, shape", [
    (lambda: MaxPool1d(3, 2, 1, dilation=2, ceil_mode=True), (2, 3, 9)),
    (lambda: MaxPool2d((3, 2), (2, 1), (1, 1), ceil_mode=True), (2, 2, 7, 6)),
    (lambda: AvgPool1d(3, 2, 1, ceil_mode=True, count_include_pad=False), (2, 3, 8)),
    (lambda: AvgPool2d(3, 2, 1, divisor_override=4), (2, 2, 7, 6)),
])
def test_gradcheck_trace_and_compile(make, shape):
    layer = make()
    x = randn(*shape)
    assert_gradcheck(layer, x)
    assert_traces(layer, x)
    assert_compiles(layer, x)


def test_compile_with_return_indices():
    assert_compiles(MaxPool2d(2, return_indices=True), randn(1, 2, 6, 6))


@pytest.mark.parametrize("ours, op", [
    (MaxPool1d(3, 2, 1, ceil_mode=True), "max_pool1d"), (MaxPool2d(3, 2, 1, dilation=2), "max_pool2d"),
    (AvgPool1d(3, 2, 1, count_include_pad=False), "avg_pool1d"), (AvgPool2d(2, divisor_override=3), "avg_pool2d"),
])
def test_round_trip_and_shape_op(ours, op):
    ref = ours.to_torch()
    assert type(type(ours).from_torch(ref)) is type(ours)
    again = type(ours).from_torch(ref)
    assert again._config() == ours._config()
    nd = ours._nd
    x = randn(2, 3, *([9] * nd))
    torch.testing.assert_close(ours(x), ref(x))
    assert_shape_op(ours, x, type(ref), op)


def test_stride_defaults_to_kernel_size_and_a_one_tuple_broadcasts():
    layer = MaxPool2d((3,))
    assert layer.kernel_size == (3, 3) and layer.stride == (3, 3)


@pytest.mark.parametrize("make, message", [
    (lambda: MaxPool2d(3, padding=2), r"MaxPool2d: padding: expected padding ≤ kernel_size // 2 = 1 along H, got 2"),
    (lambda: MaxPool1d(2, padding=2, dilation=3), r"MaxPool1d: padding: expected padding ≤ kernel_size // 2 = 1"),
    (lambda: AvgPool2d((2, 4), padding=(1, 3)), r"AvgPool2d: padding: .* = 2 along W, got 3"),
    (lambda: AvgPool2d(2, divisor_override=0), r"AvgPool2d: divisor_override: expected None or a non-zero int, got 0"),
    (lambda: MaxPool2d(0), r"MaxPool2d: kernel_size: expected an int ≥ 1 or a tuple of 2 such ints, got 0"),
    (lambda: AvgPool1d(2, stride=(1, 1)), r"AvgPool1d: stride: expected an int ≥ 1 or a tuple of 1 such ints"),
])
def test_construction_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("layer, x, message", [
    (MaxPool2d(3), torch.randn(1, 1, 2, 5),
     r"MaxPool2d: input: expected at least one window along every spatial dim, got input size \(2, 5\) → "
     r"output size \(0, 1\) → use a larger input, a smaller kernel_size, more padding or ceil_mode=True"),
    (AvgPool1d(2), torch.randn(4, 1, 2, 5), r"AvgPool1d: input: expected a 3-D \(N, C, L\) or 2-D unbatched"),
    (MaxPool2d(2), torch.ones(1, 1, 4, 4, dtype=torch.long),
     r"MaxPool2d: input: expected a floating-point tensor, got dtype torch.int64 → convert it: x.float\(\)"),
])
def test_input_errors(layer, x, message):
    with pytest.raises(ValueError, match=message):
        layer(x)


@pytest.mark.parametrize("layer", [AvgPool2d(3, 2, 1, ceil_mode=True), AvgPool2d(3, 2, 1, count_include_pad=False),
                                   MaxPool2d(3, 2, 1, ceil_mode=True), AvgPool1d(3, 2, 1, ceil_mode=True)])
def test_a_trace_made_at_one_size_equals_eager_at_others(layer):
    # the divisors and the ceil-mode drop are tensor arithmetic on the traced sizes (see pool.py),
    # so 9×9 (where ceil mode adds a window the 8×8 trace did not have) is right, not frozen at 8×8
    nd = layer._nd
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = torch.jit.trace(layer, torch.randn(1, 2, *([8] * nd)))
    assert not [w for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    for size in (7, 9, 12):
        x = torch.randn(2, 2, *([size] * nd))
        torch.testing.assert_close(traced(x), layer(x))
        torch.testing.assert_close(layer(x), layer.to_torch()(x))
    x = torch.randn(1, 2, *([9] * nd))
    assert_compiles(layer, x)  # torch.compile recompiles per size instead

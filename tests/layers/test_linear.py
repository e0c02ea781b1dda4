"""layerlab.layers.linear against torch.nn.Linear."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from layerlab.layers.linear import Linear
from tests.layers._spatial_checks import F64, assert_compiles, assert_gradcheck, assert_parity, assert_traces, randn


@settings(max_examples=40, deadline=None)
@given(in_features=st.integers(1, 9), out_features=st.integers(1, 9), bias=st.booleans(),
       lead=st.lists(st.integers(1, 3), max_size=3))
def test_forward_backward_parity_with_torch(in_features, out_features, bias, lead):
    ref = nn.Linear(in_features, out_features, bias=bias, dtype=F64)
    assert_parity(Linear.from_torch(ref), ref, randn(*lead, in_features))


def test_default_init_draws_the_same_numbers_as_torch():
    torch.manual_seed(7)
    ref = nn.Linear(50, 20)
    torch.manual_seed(7)
    ours = Linear(50, 20)
    torch.testing.assert_close(ours.weight, ref.weight, rtol=0, atol=1e-7)
    torch.testing.assert_close(ours.bias, ref.bias, rtol=0, atol=1e-7)
    # kaiming_uniform(a=√5) is U(−1/√in, 1/√in): the largest of 1000 draws is close to the bound
    assert 0.95 / math.sqrt(50) < ours.weight.abs().max() <= 1 / math.sqrt(50)


def test_the_issue_message():
    with pytest.raises(ValueError, match=r"^Linear: input: expects last dim = in_features = 100, got 7200 "
                                         r"\(input shape \(4, 7200\)\) → set in_features=7200$"):
        Linear(100, 10)(torch.randn(4, 7200))


def test_an_unflattened_feature_map_gets_a_flatten_hint():
    with pytest.raises(ValueError, match=r"got 15 .* → flatten the features first: x.flatten\(1\) gives \(2, 7200\)"):
        Linear(7200, 10)(torch.randn(2, 32, 15, 15))


@pytest.mark.parametrize("x, message", [
    (torch.tensor(3.0), r"Linear: input: expects last dim = in_features = 4, got a scalar"),
    (torch.randn(2, 4, dtype=F64), r"Linear: input: expected dtype torch.float32 .* got dtype torch.float64"),
])
def test_other_input_errors(x, message):
    with pytest.raises(ValueError, match=message):
        Linear(4, 2)(x)


def test_construction_error():
    with pytest.raises(ValueError, match=r"Linear: out_features: expected a positive int, got 0"):
        Linear(3, 0)


def test_gradcheck_trace_and_compile():
    layer = Linear(5, 3).double()
    x = randn(2, 4, 5)
    assert_gradcheck(layer, x)
    assert_traces(layer, x)
    assert_compiles(layer, x)


def test_round_trip():
    ours = Linear(6, 2, bias=False, dtype=F64)
    ref = ours.to_torch()
    assert type(ref) is nn.Linear and ref.bias is None and torch.equal(ref.weight, ours.weight)
    x = randn(3, 6)
    assert torch.equal(Linear.from_torch(ref)(x), ref(x))
    assert repr(Linear(6, 2)) == repr(nn.Linear(6, 2))
    with pytest.raises(TypeError, match="Linear.from_torch: expected torch.nn.Linear, got Conv1d"):
        Linear.from_torch(nn.Conv1d(1, 1, 1))

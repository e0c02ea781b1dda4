"""layerlab.layers.cells against torch.nn.RNNCell / LSTMCell / GRUCell."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from layerlab.layers.cells import GRUCell, LSTMCell, RNNCell
from tests.layers._seq_helpers import F64, assert_compiles, assert_gradcheck, assert_parity, assert_traces, randn

CELLS = {"rnn": (RNNCell, nn.RNNCell), "lstm": (LSTMCell, nn.LSTMCell), "gru": (GRUCell, nn.GRUCell)}


def _inputs(kind: str, I: int, H: int, batch, with_hx: bool, seed: int = 0):
    lead = (batch,) if batch else ()
    x = randn(*lead, I, seed=seed)
    if not with_hx:
        return (x,), {}
    if kind == "lstm":
        return (x, (randn(*lead, H, seed=seed + 1), randn(*lead, H, seed=seed + 2))), {}
    return (x, randn(*lead, H, seed=seed + 1)), {}


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(sorted(CELLS)), I=st.integers(1, 5), H=st.integers(1, 5), bias=st.booleans(),
       batch=st.sampled_from([None, 1, 3]), with_hx=st.booleans(), relu=st.booleans(), via_from=st.booleans())
def test_parity_forward_backward_float64(kind, I, H, bias, batch, with_hx, relu, via_from):
    ours_cls, torch_cls = CELLS[kind]
    kwargs = {"nonlinearity": "relu"} if (kind == "rnn" and relu) else {}
    if via_from:  # torch's init, copied in
        ref = torch_cls(I, H, bias=bias, dtype=F64, **kwargs)
        ours = ours_cls.from_torch(ref)
    else:  # our init, copied out
        ours = ours_cls(I, H, bias=bias, dtype=F64, **kwargs)
        ref = ours.to_torch()
    assert type(ref) is torch_cls
    assert_parity(ours, ref, _inputs(kind, I, H, batch, with_hx))


@pytest.mark.parametrize("kind", sorted(CELLS))
def test_parameter_names_shapes_and_init_match_torch(kind):
    ours_cls, torch_cls = CELLS[kind]
    ours, ref = ours_cls(7, 50), torch_cls(7, 50)
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [(n, p.shape) for n, p in ref.named_parameters()]
    bound = 1 / math.sqrt(50)
    for p in ours.parameters():  # U(−1/√H, 1/√H): inside the bound and spread over it
        assert p.abs().max() <= bound and p.abs().max() > 0.8 * bound


@pytest.mark.parametrize("kind", sorted(CELLS))
def test_gradcheck(kind):
    ours_cls, _ = CELLS[kind]
    assert_gradcheck(ours_cls(3, 4, dtype=F64), _inputs(kind, 3, 4, 2, True))


def test_gru_reset_gate_multiplies_b_hn():
    """b_hn sits inside r ⊙ (W_hn h + b_hn): with r ≈ 0 it has no effect, b_in still has."""
    cell = GRUCell(2, 3, dtype=F64)
    with torch.no_grad():
        cell.weight_ih.zero_()
        cell.weight_hh.zero_()
        cell.bias_ih.zero_()
        cell.bias_hh.zero_()
        cell.bias_ih[:3] = -50.0  # r = σ(−50) ≈ 0
    x, h = torch.zeros(1, 2, dtype=F64), torch.zeros(1, 3, dtype=F64)
    base = cell(x, h)
    with torch.no_grad():
        cell.bias_hh[6:] = 5.0  # b_hn, gated away by r
    torch.testing.assert_close(cell(x, h), base)
    with torch.no_grad():
        cell.bias_ih[6:] = 5.0  # b_in, not gated
    assert not torch.allclose(cell(x, h), base)


@pytest.mark.parametrize("kind", sorted(CELLS))
def test_trace_and_compile(kind):
    ours_cls, _ = CELLS[kind]
    cell = ours_cls(3, 4, dtype=F64)
    assert_traces(cell, _inputs(kind, 3, 4, 2, True, seed=0), _inputs(kind, 3, 4, 2, True, seed=10))
    # aot_eager: full-graph capture + AOTAutograd without minutes of C++ compilation
    assert_compiles(cell, _inputs(kind, 3, 4, 2, True))


def test_input_size_error_names_expected_got_and_fix():
    with pytest.raises(ValueError, match=r"LSTMCell: input_size: expected 10, got 12 \(input shape \[4, 12\]\)"
                                         r" → .*input_size=12"):
        LSTMCell(10, 20)(torch.randn(4, 12))


def test_state_shape_error():
    with pytest.raises(ValueError, match=r"GRUCell: hx shape: expected \[4, 20\] = \[B, H\], got \[3, 20\]"):
        GRUCell(10, 20)(torch.randn(4, 10), torch.randn(3, 20))
    with pytest.raises(ValueError, match=r"RNNCell: hx shape: expected \[20\] = \[H\] \(the input is unbatched\)"):
        RNNCell(10, 20)(torch.randn(10), torch.randn(1, 20))
    with pytest.raises(ValueError, match=r"LSTMCell: hx: expected a tuple \(h, c\), got Tensor"):
        LSTMCell(10, 20)(torch.randn(4, 10), torch.randn(4, 20))


def test_rank_dtype_and_constructor_errors():
    with pytest.raises(ValueError, match=r"RNNCell: input rank: expected 2-D \[B, I\] or 1-D \[I\]"):
        RNNCell(10, 20)(torch.randn(2, 3, 10))
    with pytest.raises(ValueError, match=r"input dtype: expected torch.float32 .* got torch.float64 → .*\.to\("):
        RNNCell(10, 20)(torch.randn(3, 10, dtype=F64))
    with pytest.raises(ValueError, match=r"RNNCell: nonlinearity: expected 'tanh' or 'relu', got 'gelu'"):
        RNNCell(10, 20, nonlinearity="gelu")
    with pytest.raises(ValueError, match=r"LSTMCell: hidden_size: expected a positive int, got 0"):
        LSTMCell(10, 0)
    with pytest.raises(TypeError, match=r"expected a torch.nn.GRUCell, got LSTMCell"):
        GRUCell.from_torch(nn.LSTMCell(2, 3))

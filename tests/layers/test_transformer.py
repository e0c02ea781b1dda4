"""layerlab.layers.transformer against torch.nn.TransformerEncoderLayer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from layerlab.layers.attention import causal_mask
from layerlab.layers.transformer import TransformerEncoderLayer
from tests.layers._seq_helpers import F64, assert_compiles, assert_gradcheck, assert_parity, assert_traces, randn


def _src(B, T, D, batch_first, batched, seed=0):
    x = randn(B, T, D, seed=seed)
    if not batched:
        return x[0].detach().requires_grad_(True)
    return x if batch_first else x.transpose(0, 1).detach().requires_grad_(True)


@st.composite
def encoder_cases(draw):
    nhead = draw(st.sampled_from([1, 2]))
    D = nhead * draw(st.integers(1, 3))
    train = draw(st.booleans())
    ctor = dict(d_model=D, nhead=nhead, dim_feedforward=draw(st.integers(1, 6)),
                dropout=0.0 if train else draw(st.sampled_from([0.0, 0.3])),  # eval ignores dropout
                activation=draw(st.sampled_from(["relu", "gelu", F.silu])),
                layer_norm_eps=draw(st.sampled_from([1e-5, 1e-3])), batch_first=draw(st.booleans()),
                norm_first=draw(st.booleans()), bias=draw(st.booleans()))
    batched = draw(st.booleans())
    B, T = (draw(st.integers(1, 2)) if batched else 1), draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    kwargs = {}
    as_bool = draw(st.booleans())
    mask = draw(st.sampled_from(["none", "random", "causal"]))
    if mask == "causal":
        blocked = ~causal_mask(T)
        kwargs["is_causal"] = True
    elif mask == "random":
        blocked = torch.rand(T, T, generator=g) < 0.3
        blocked[:, 0] = False
    if mask != "none":
        kwargs["src_mask"] = blocked if as_bool else torch.zeros(T, T, dtype=F64).masked_fill(blocked, float("-inf"))
    if draw(st.booleans()):
        pad = torch.rand((B, T) if batched else (T,), generator=g) < 0.3
        pad[..., 0] = False
        kwargs["src_key_padding_mask"] = pad if as_bool else torch.zeros(pad.shape, dtype=F64).masked_fill(
            pad, float("-inf"))
    src = _src(B, T, D, ctor["batch_first"], batched, seed)
    return dict(ctor=ctor, train=train, inputs=((src,), kwargs), via_from=draw(st.booleans()))


@settings(max_examples=40, deadline=None)
@given(case=encoder_cases())
def test_parity_forward_backward_float64(case):
    if case["via_from"]:
        ref = nn.TransformerEncoderLayer(**case["ctor"], dtype=F64)
        ours = TransformerEncoderLayer.from_torch(ref)
    else:
        ours = TransformerEncoderLayer(**case["ctor"], dtype=F64)
        ref = ours.to_torch()
    ours.train(case["train"])
    ref.train(case["train"])
    assert_parity(ours, ref, case["inputs"])


class _FixedNoise(nn.Module):
    """A stand-in for dropout that multiplies by a fixed signed pattern: it does not commute with
    the activation, so only the same placement gives the same output."""

    def __init__(self, seed):
        super().__init__()
        self.seed = seed

    def forward(self, x):
        return x * torch.randn(x.shape, generator=torch.Generator().manual_seed(self.seed), dtype=x.dtype)


@pytest.mark.parametrize("norm_first", [False, True])
def test_dropouts_sit_where_torch_puts_them(norm_first):
    ours = TransformerEncoderLayer(4, 2, 6, dropout=0.0, norm_first=norm_first, batch_first=True, dtype=F64)
    ref = ours.to_torch()
    for layer in (ours, ref):
        layer.dropout, layer.dropout1, layer.dropout2 = _FixedNoise(1), _FixedNoise(2), _FixedNoise(3)
    assert_parity(ours, ref, ((randn(2, 3, 4),), {}))


@pytest.mark.parametrize("norm_first", [False, True])
def test_dropout_one_zeroes_both_branches(norm_first):
    """p = 1 drops every branch in training mode: post-LN leaves norm2(norm1(x)), pre-LN leaves x."""
    ours = TransformerEncoderLayer(8, 2, 16, dropout=1.0, norm_first=norm_first, batch_first=True, dtype=F64)
    x = randn(2, 5, 8, requires_grad=False)
    expected = x if norm_first else ours.norm2(ours.norm1(x))
    torch.testing.assert_close(ours.train()(x), expected)
    torch.testing.assert_close(ours.to_torch().train()(x), expected)


def test_eval_fast_path_parity():
    """Without grad in eval mode torch runs its fused encoder kernel; the numbers agree."""
    ours = TransformerEncoderLayer(8, 2, 16, batch_first=True, dtype=F64).eval()
    ref = ours.to_torch().eval()
    x = randn(2, 5, 8, requires_grad=False)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 3:] = True
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x))
        kept = ~pad  # the fast path may leave padded positions with other values
        torch.testing.assert_close(ours(x, src_key_padding_mask=pad)[kept], ref(x, src_key_padding_mask=pad)[kept])


def test_submodule_names_match_torch_and_gelu_round_trips():
    ours = TransformerEncoderLayer(8, 2, 16, activation="gelu", norm_first=True)
    ref = nn.TransformerEncoderLayer(8, 2, 16, activation="gelu", norm_first=True)
    assert sorted(ours.state_dict()) == sorted(ref.state_dict())
    back = TransformerEncoderLayer.from_torch(ours.to_torch())
    assert back.activation is F.gelu and back.norm_first


def test_gradcheck():
    for norm_first in (False, True):
        layer = TransformerEncoderLayer(4, 2, 6, dropout=0.0, activation="gelu", norm_first=norm_first,
                                        batch_first=True, dtype=F64)
        assert_gradcheck(layer, ((randn(2, 3, 4),), {"src_mask": causal_mask(3, dtype=F64)}))


def test_trace_and_compile():
    """aot_eager: full-graph capture + AOTAutograd without minutes of C++ compilation."""
    layer = TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, dtype=F64)
    mask = causal_mask(5, dtype=F64)
    assert_traces(layer, ((randn(2, 5, 8),), {"src_mask": mask}), ((randn(2, 5, 8, seed=9),), {"src_mask": mask}))
    assert_compiles(layer, ((randn(2, 5, 8),), {"src_mask": mask}))
    assert_compiles(TransformerEncoderLayer(8, 2, 16, dropout=0.0, norm_first=True, dtype=F64),
                    ((randn(5, 2, 8),), {}))


def test_input_errors():
    layer = TransformerEncoderLayer(8, 2, 16, batch_first=True)
    with pytest.raises(ValueError, match=r"TransformerEncoderLayer: d_model: expected 8, got 6 \(src shape "
                                         r"\[2, 5, 6\]\) → .*d_model=6"):
        layer(torch.randn(2, 5, 6))
    with pytest.raises(ValueError, match=r"src rank: expected 3-D \[B, T, D\] \(batch_first=True\) or 2-D"):
        layer(torch.randn(5, 8, 2, 3))
    with pytest.raises(ValueError, match=r"MultiheadAttention: attn_mask shape: expected \[5, 5\]"):
        layer(torch.randn(2, 5, 8), src_mask=torch.zeros(4, 4))
    with pytest.raises(ValueError, match=r"activation: expected 'relu' or 'gelu', got 'tanh'"):
        TransformerEncoderLayer(8, 2, activation="tanh")
    with pytest.raises(ValueError, match=r"num_heads: expected a divisor of embed_dim=8, got 3"):
        TransformerEncoderLayer(8, 3)

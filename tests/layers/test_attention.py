"""layerlab.layers.attention against torch.nn.functional.scaled_dot_product_attention."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from layerlab.layers.attention import (
    ScaledDotProductAttention,
    TorchScaledDotProductAttention,
    attention_with_weights,
    causal_mask,
    scaled_dot_product_attention,
)
from tests.layers._seq_helpers import F64, assert_compiles, assert_gradcheck, assert_parity, assert_traces, randn


@st.composite
def sdpa_cases(draw):
    batch = draw(st.sampled_from([(), (2,), (2, 3)]))
    L, S, E, Ev = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    mask_kind = draw(st.sampled_from(["none", "bool", "float", "causal"]))
    gqa = len(batch) == 2 and draw(st.booleans())
    kv_batch = batch[:-1] + (1,) if gqa else batch  # one key/value head shared by 3 query heads
    seed = draw(st.integers(0, 2**16))
    q = randn(*batch, L, E, seed=seed)
    k, v = randn(*kv_batch, S, E, seed=seed + 1), randn(*kv_batch, S, Ev, seed=seed + 2)
    kwargs = {"scale": draw(st.sampled_from([None, 0.3]))}
    if gqa:
        kwargs["enable_gqa"] = True
    if mask_kind == "causal":
        kwargs["is_causal"] = True
    elif mask_kind != "none":
        # a mask broadcast from fewer dims, or a full one; ≥ 1 allowed key per row
        mask_shape = draw(st.sampled_from([(L, S), (1, S), batch + (L, S)]))
        g = torch.Generator().manual_seed(seed)
        allowed = torch.rand(mask_shape, generator=g) < 0.7
        allowed[..., 0] = True
        if mask_kind == "bool":
            kwargs["attn_mask"] = allowed
        else:  # an additive mask: −inf where blocked plus a finite bias that gets a gradient
            bias = torch.randn(mask_shape, generator=g, dtype=F64)
            kwargs["attn_mask"] = bias.masked_fill(~allowed, float("-inf")).requires_grad_(True)
    return (q, k, v), kwargs


@settings(max_examples=50, deadline=None)
@given(case=sdpa_cases())
def test_function_parity_forward_backward_float64(case):
    assert_parity(scaled_dot_product_attention, F.scaled_dot_product_attention, case)


def test_fully_masked_rows_give_zeros_like_torch():
    q, k, v = randn(2, 3, 4), randn(2, 5, 4), randn(2, 5, 4)
    allowed = torch.ones(3, 5, dtype=torch.bool)
    allowed[1] = False  # query 1 may attend nothing
    out = scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    assert torch.equal(out[:, 1], torch.zeros(2, 4, dtype=F64))
    assert_parity(scaled_dot_product_attention, F.scaled_dot_product_attention, ((q, k, v), {"attn_mask": allowed}))
    float_mask = torch.zeros(3, 5, dtype=F64).masked_fill(~allowed, float("-inf")).requires_grad_(True)
    assert_parity(scaled_dot_product_attention, F.scaled_dot_product_attention, ((q, k, v), {"attn_mask": float_mask}))


@pytest.mark.parametrize("L,S", [(1, 1), (4, 4), (3, 6), (6, 3), (37, 37)])
def test_causal_mask_any_length(L, S):
    allowed = causal_mask(L, S)
    for i in range(L):
        for j in range(S):
            assert bool(allowed[i, j]) == (j <= i)
    additive = causal_mask(L, S, dtype=F64)
    assert torch.equal(additive == 0, allowed) and torch.isinf(additive[~allowed]).all()
    # equal to SDPA's own is_causal, in both forms
    q, k = randn(L, 3, requires_grad=False), randn(S, 3, requires_grad=False)
    ref = F.scaled_dot_product_attention(q, k, k, is_causal=True)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, k, attn_mask=allowed), ref)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, k, attn_mask=additive), ref)


def test_causal_mask_values():
    assert causal_mask(3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert causal_mask(2, dtype=torch.float32).tolist() == [[0.0, float("-inf")], [0.0, 0.0]]


def test_module_matches_torch_wrapper_and_keeps_weights():
    ours = ScaledDotProductAttention(dropout_p=0.3, is_causal=True).eval()  # eval: no dropout
    ref = ours.to_torch()
    assert isinstance(ref, TorchScaledDotProductAttention) and not ref.training
    x = randn(2, 4, 5, 3)
    assert_parity(ours, ref, ((x, x, x), {}))
    w = ours.last_attn_weights
    assert w.shape == (2, 4, 5, 5) and not w.requires_grad
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 5, dtype=F64))
    assert (w.triu(1) == 0).all()  # causal: nothing above the diagonal
    back = ScaledDotProductAttention.from_torch(ref)
    assert (back.dropout_p, back.is_causal) == (0.3, True)


def test_module_dropout_only_in_training_and_weights_are_post_dropout():
    torch.manual_seed(0)
    layer = ScaledDotProductAttention(dropout_p=0.5)
    q = torch.randn(2, 6, 4)
    out_train = layer.train()(q, q, q)
    w = layer.last_attn_weights
    assert ((w == 0) | (w > 0)).all() and (w == 0).any()  # some weights dropped, the rest scaled by 2
    torch.testing.assert_close(out_train, w @ q)
    out_eval = layer.eval()(q, q, q)
    torch.testing.assert_close(out_eval, F.scaled_dot_product_attention(q, q, q))


def test_gradcheck():
    mask = randn(4, 5, seed=3)
    qkv = (randn(2, 4, 3), randn(2, 5, 3), randn(2, 5, 2))
    assert_gradcheck(ScaledDotProductAttention(), (qkv, {"attn_mask": mask}))
    assert_gradcheck(ScaledDotProductAttention(is_causal=True), ((randn(2, 4, 3), randn(2, 4, 3), randn(2, 4, 2)), {}))


def test_trace_and_compile():
    """aot_eager: full-graph capture + AOTAutograd without minutes of C++ compilation."""
    layer = ScaledDotProductAttention()
    mask = causal_mask(4, dtype=F64)

    def inputs(seed):
        return (randn(2, 3, 4, 5, seed=seed), randn(2, 3, 4, 5, seed=seed + 1), randn(2, 3, 4, 5, seed=seed + 2)), \
            {"attn_mask": mask}

    assert_traces(layer, inputs(0), inputs(10))
    assert_compiles(layer, inputs(0))
    assert_compiles(ScaledDotProductAttention(is_causal=True), ((randn(2, 4, 5),) * 3, {}))


def test_reference_loop_in_docstring_is_right():
    q, k, v = randn(3, 2, requires_grad=False), randn(4, 2, requires_grad=False), randn(4, 3, requires_grad=False)
    scale = 1 / math.sqrt(2)
    out = torch.zeros(3, 3, dtype=F64)
    for i in range(3):
        s = [sum(q[i][e] * k[j][e] for e in range(2)) * scale for j in range(4)]
        w = [math.exp(x - max(s)) for x in s]
        w = [x / sum(w) for x in w]
        out[i] = torch.tensor([sum(w[j] * v[j][f] for j in range(4)) for f in range(3)])
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v), out)


def test_attention_with_weights_returns_the_softmax():
    q, k, v = (randn(*shape, requires_grad=False) for shape in ((2, 3, 4), (2, 5, 4), (2, 5, 1)))
    out, w = attention_with_weights(q, k, v)
    torch.testing.assert_close(w, torch.softmax(q @ k.transpose(-2, -1) / 2, dim=-1))
    torch.testing.assert_close(out, w @ v)


def test_input_errors():
    q = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match=r"key features E: expected 4, got 5 \(query \[2, 3, 4\], key \[2, 6, 5\]"):
        scaled_dot_product_attention(q, torch.randn(2, 6, 5), torch.randn(2, 6, 4))
    with pytest.raises(ValueError, match=r"value length S: expected 6, got 5"):
        scaled_dot_product_attention(q, torch.randn(2, 6, 4), torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match=r"masks: expected attn_mask or is_causal=True, got both → drop attn_mask"):
        scaled_dot_product_attention(q, q, q, attn_mask=causal_mask(3), is_causal=True)
    with pytest.raises(ValueError, match=r"attn_mask shape: expected \[..., 3, 3\] = \[..., L, S\] .*got \[3, 4\]"):
        scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"attn_mask dtype: expected torch.bool or a floating dtype, got torch.int64"):
        scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"GQA heads: expected query heads Hq divisible by key heads Hk"):
        scaled_dot_product_attention(torch.randn(1, 3, 2, 4), torch.randn(1, 2, 2, 4), torch.randn(1, 2, 2, 4),
                                     enable_gqa=True)
    with pytest.raises(ValueError, match=r"ScaledDotProductAttention: dropout_p: expected a probability"):
        ScaledDotProductAttention(dropout_p=-0.1)
    with pytest.raises(ValueError, match=r"causal_mask: dtype: expected torch.bool or a floating dtype"):
        causal_mask(3, dtype=torch.int64)

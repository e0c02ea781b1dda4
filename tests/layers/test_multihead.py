"""layerlab.layers.multihead against torch.nn.MultiheadAttention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from layerlab.layers.attention import causal_mask
from layerlab.layers.multihead import MultiheadAttention
from tests.layers._seq_helpers import F64, assert_compiles, assert_gradcheck, assert_parity, assert_traces, randn


def _layout(t, batch_first, batched):
    """A (B, seq, feat) tensor in the layer's layout (seq-first, or unbatched)."""
    if not batched:
        return t[0]
    return t if batch_first else t.transpose(0, 1)


def _leaf(t):
    return t.detach().clone().requires_grad_(True)


@st.composite
def mha_cases(draw):
    nh = draw(st.sampled_from([1, 2, 3]))
    E = nh * draw(st.integers(1, 3))
    cross_dims = draw(st.booleans())
    kdim, vdim = (draw(st.integers(1, 4)), draw(st.integers(1, 4))) if cross_dims else (None, None)
    ctor = dict(embed_dim=E, num_heads=nh, bias=draw(st.booleans()), add_bias_kv=draw(st.booleans()),
                add_zero_attn=draw(st.booleans()), kdim=kdim, vdim=vdim, batch_first=draw(st.booleans()))
    train = draw(st.booleans())
    ctor["dropout"] = 0.0 if train else draw(st.sampled_from([0.0, 0.4]))  # eval mode ignores dropout
    batched = draw(st.booleans())
    B = draw(st.integers(1, 2)) if batched else 1
    L = draw(st.integers(1, 4))
    self_attn = not cross_dims and draw(st.booleans())
    S = L if self_attn else draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    q = randn(B, L, E, seed=seed)
    if self_attn:
        q = _leaf(_layout(q, ctor["batch_first"], batched))
        query = key = value = q
    else:
        query = _leaf(_layout(q, ctor["batch_first"], batched))
        key = _leaf(_layout(randn(B, S, kdim or E, seed=seed + 1), ctor["batch_first"], batched))
        value = _leaf(_layout(randn(B, S, vdim or E, seed=seed + 2), ctor["batch_first"], batched))
    kwargs = dict(need_weights=draw(st.booleans()), average_attn_weights=draw(st.booleans()))
    mask_kind = draw(st.sampled_from(["bool", "float"]))
    attn = draw(st.sampled_from(["none", "2d", "3d", "causal"]))
    if attn == "causal" and L == S:
        blocked = ~causal_mask(L)  # MHA's bool convention: True = NOT allowed
        # torch's hint path loses the appended bias_kv / zero key (pinned in its own test below)
        kwargs["is_causal"] = not (ctor["add_bias_kv"] or ctor["add_zero_attn"])
    elif attn in ("2d", "3d", "causal"):
        shape = (L, S) if attn != "3d" else (B * nh, L, S)
        blocked = torch.rand(shape, generator=g) < 0.3
    if attn != "none":
        blocked[..., 0] = False  # every query keeps key 0: no fully blocked rows here
        # a float mask: −inf where blocked plus a random bias, except that the is_causal hint
        # promises exactly the causal mask (torch may then use its own and ignore the values)
        bias = torch.zeros(blocked.shape, dtype=F64) if kwargs.get("is_causal") else \
            torch.randn(blocked.shape, generator=g, dtype=F64)
        kwargs["attn_mask"] = blocked if mask_kind == "bool" else bias.masked_fill(blocked, float("-inf"))
    if draw(st.booleans()):
        pad = torch.rand((B, S) if batched else (S,), generator=g) < 0.3
        pad[..., 0] = False
        kwargs["key_padding_mask"] = pad if mask_kind == "bool" else torch.zeros(pad.shape, dtype=F64).masked_fill(
            pad, float("-inf"))
    return dict(ctor=ctor, train=train, inputs=((query, key, value), kwargs), via_from=draw(st.booleans()))


@settings(max_examples=50, deadline=None)
@given(case=mha_cases())
def test_parity_forward_backward_float64(case):
    if case["via_from"]:
        ref = nn.MultiheadAttention(**case["ctor"], dtype=F64)
        ours = MultiheadAttention.from_torch(ref)
    else:
        ours = MultiheadAttention(**case["ctor"], dtype=F64)
        ref = ours.to_torch()
    ours.train(case["train"])
    ref.train(case["train"])
    assert_parity(ours, ref, case["inputs"])


@pytest.mark.parametrize("batch_first", [False, True])
def test_3d_attn_mask_is_indexed_b_times_num_heads_plus_h(batch_first):
    """Each (batch element, head) gets its own mask at index b·nh + h, as in torch."""
    ours = MultiheadAttention(6, 3, batch_first=batch_first, dtype=F64)
    g = torch.Generator().manual_seed(0)
    blocked = torch.rand(2 * 3, 4, 5, generator=g) < 0.5
    blocked[..., 0] = False
    q = _leaf(_layout(randn(2, 4, 6), batch_first, True))
    kv = _leaf(_layout(randn(2, 5, 6, seed=1), batch_first, True))
    for mask in (blocked, torch.zeros(blocked.shape, dtype=F64).masked_fill(blocked, float("-inf"))):
        assert_parity(ours, ours.to_torch(), ((q, kv, kv), {"attn_mask": mask, "average_attn_weights": False}))


def test_parameter_names_and_shapes_match_torch():
    for kw in ({}, {"kdim": 3, "vdim": 5}, {"bias": False, "add_bias_kv": True}):
        ours, ref = MultiheadAttention(8, 2, **kw), nn.MultiheadAttention(8, 2, **kw)
        assert [(n, p.shape) for n, p in ours.named_parameters()] == [(n, p.shape) for n, p in ref.named_parameters()]
        assert sorted(ours.state_dict()) == sorted(ref.state_dict())


def test_init_like_torch():
    ours = MultiheadAttention(64, 4)
    bound = (6 / (64 + 3 * 64)) ** 0.5  # Xavier-uniform over the whole (3E, E) matrix
    assert ours.in_proj_weight.abs().max() <= bound and ours.in_proj_weight.abs().max() > 0.9 * bound
    assert (ours.in_proj_bias == 0).all() and (ours.out_proj.bias == 0).all()


def test_eval_fast_path_parity():
    """Without grad, in eval mode, torch takes its fused fast path; the numbers still agree."""
    ours = MultiheadAttention(8, 2, batch_first=True, dtype=F64).eval()
    ref = ours.to_torch().eval()
    x = randn(2, 5, 8, requires_grad=False)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 3:] = True
    with torch.no_grad():
        for kw in ({}, {"need_weights": False}, {"key_padding_mask": pad, "need_weights": False}):
            a, b = ours(x, x, x, **kw), ref(x, x, x, **kw)
            torch.testing.assert_close(a[0][pad.logical_not()], b[0][pad.logical_not()])


def test_bool_mask_convention_is_the_opposite_of_sdpa():
    """MHA: True = NOT allowed. The same tensor given to SDPA means the opposite."""
    mha = MultiheadAttention(4, 1, bias=False, batch_first=True, dtype=F64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.eye(4, dtype=F64).repeat(3, 1))
        mha.out_proj.weight.copy_(torch.eye(4, dtype=F64))
    x = randn(1, 3, 4, requires_grad=False)
    blocked = ~causal_mask(3)  # True above the diagonal
    out, _ = mha(x, x, x, attn_mask=blocked)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(x, x, x, is_causal=True))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(x, x, x, attn_mask=~blocked))
    assert not torch.allclose(out, F.scaled_dot_product_attention(x, x, x, attn_mask=blocked))


def test_fully_blocked_row_differs_from_torch_only_where_torch_gives_nan():
    ours = MultiheadAttention(4, 2, batch_first=True, dtype=F64)
    with torch.no_grad():
        ours.out_proj.bias.normal_()
    ref = ours.to_torch()
    x = randn(1, 3, 4, requires_grad=False)
    blocked = torch.zeros(3, 3, dtype=torch.bool)
    blocked[1] = True  # query 1 may attend nothing
    out, w = ours(x, x, x, attn_mask=blocked)
    torch.testing.assert_close(out[0, 1], ours.out_proj.bias)  # zero attention → only the output bias
    assert (w[0, 1] == 0).all()
    ref_out, ref_w = ref(x, x, x, attn_mask=blocked)  # torch: NaN with need_weights=True …
    assert torch.isnan(ref_out[0, 1]).all() and torch.isnan(ref_w[0, 1]).all()
    torch.testing.assert_close(out[0, [0, 2]], ref_out[0, [0, 2]])
    ref_out2, _ = ref(x, x, x, attn_mask=blocked, need_weights=False)  # … and our numbers without
    torch.testing.assert_close(out, ref_out2)


def test_is_causal_without_mask_builds_it_where_torch_raises():
    ours = MultiheadAttention(4, 2, batch_first=True, dtype=F64)
    x = randn(2, 3, 4, requires_grad=False)
    out, _ = ours(x, x, x, is_causal=True)
    torch.testing.assert_close(out, ours(x, x, x, attn_mask=causal_mask(3, dtype=F64))[0])
    with pytest.raises(RuntimeError, match="Need attn_mask if specifying the is_causal hint"):
        ours.to_torch()(x, x, x, is_causal=True)


@pytest.mark.parametrize("extra", ["add_bias_kv", "add_zero_attn"])
def test_is_causal_hint_keeps_appended_keys_unlike_torch_sdpa_path(extra):
    """torch, given is_causal=True and need_weights=False, drops attn_mask for SDPA's own causal
    mask, which also blocks the appended bias_kv / zero key. We keep using attn_mask, which
    equals torch's result with need_weights=True or without the hint."""
    ours = MultiheadAttention(4, 2, batch_first=True, dtype=F64, **{extra: True})
    ref = ours.to_torch()
    x = randn(2, 3, 4, requires_grad=False)
    blocked = ~causal_mask(3)
    out = ours(x, x, x, attn_mask=blocked, is_causal=True, need_weights=False)[0]
    torch.testing.assert_close(out, ref(x, x, x, attn_mask=blocked, is_causal=True, need_weights=True)[0])
    torch.testing.assert_close(out, ref(x, x, x, attn_mask=blocked, need_weights=False)[0])
    assert not torch.allclose(out, ref(x, x, x, attn_mask=blocked, is_causal=True, need_weights=False)[0])


def test_last_attn_weights_per_head_even_without_need_weights():
    mha = MultiheadAttention(6, 3, dtype=F64)
    q = randn(4, 2, 6, requires_grad=False)  # (L, B, E): batch_first=False
    k = randn(5, 2, 6, requires_grad=False)
    out, w = mha(q, k, k, need_weights=False)
    assert w is None and mha.last_attn_weights.shape == (2, 3, 4, 5)
    _, avg = mha(q, k, k)
    torch.testing.assert_close(avg, mha.last_attn_weights.mean(1))
    mha(q[:, 0], k[:, 0], k[:, 0])  # unbatched
    assert mha.last_attn_weights.shape == (3, 4, 5)


def test_gradcheck():
    for kw in ({}, {"add_bias_kv": True, "add_zero_attn": True, "kdim": 3, "vdim": 2}):
        mha = MultiheadAttention(4, 2, batch_first=True, dtype=F64, **kw)
        q = randn(2, 3, 4)
        k, v = randn(2, 4, kw.get("kdim", 4), seed=1), randn(2, 4, kw.get("vdim", 4), seed=2)
        mask = randn(3, 4, seed=3)
        assert_gradcheck(mha, ((q, k, v), {"attn_mask": mask, "average_attn_weights": False}))


def test_trace_and_compile():
    """aot_eager: full-graph capture + AOTAutograd without minutes of C++ compilation."""
    mha = MultiheadAttention(8, 2, batch_first=True, dtype=F64)
    mask = causal_mask(5, dtype=F64)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 4] = True

    def inputs(seed, self_attn=True):
        q = randn(2, 5, 8, seed=seed)
        kv = q if self_attn else randn(2, 5, 8, seed=seed + 1)
        return (q, kv, kv), {"attn_mask": mask, "key_padding_mask": pad}

    assert_traces(mha, inputs(0), inputs(10))
    assert_compiles(mha, inputs(0))
    assert_compiles(mha, inputs(0, self_attn=False))


def test_input_errors():
    mha = MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"MultiheadAttention: query features \(embed_dim\): expected 8, got 6"):
        mha(torch.randn(2, 5, 6), x, x)
    with pytest.raises(ValueError, match=r"attn_mask shape: expected \[5, 5\] = \[L, S\] or \[4, 5, 5\] = "
                                         r"\[B·num_heads, L, S\], got \[2, 5, 5\]"):
        mha(x, x, x, attn_mask=torch.zeros(2, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"key_padding_mask shape: expected \[2, 5\] = \[B, S\], got \[5, 2\]"):
        mha(x, x, x, key_padding_mask=torch.zeros(5, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"key_padding_mask dtype: expected torch.bool or a floating dtype"):
        mha(x, x, x, key_padding_mask=torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"batch size: expected one B for query, key, value \(dim 0\), got 2, 3, 3"):
        mha(x, torch.randn(3, 5, 8), torch.randn(3, 5, 8))
    with pytest.raises(ValueError, match=r"key rank: expected 3-D like query, got 2-D"):
        mha(x, x[0], x[0])
    with pytest.raises(ValueError, match=r"num_heads: expected a divisor of embed_dim=10, got 4 → pick num_heads "
                                         r"from \[1, 2, 5, 10\]"):
        MultiheadAttention(10, 4)
    with pytest.raises(TypeError, match=r"expected a torch.nn.MultiheadAttention, got Linear"):
        MultiheadAttention.from_torch(nn.Linear(2, 2))

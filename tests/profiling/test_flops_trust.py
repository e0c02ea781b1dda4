"""profile's FLOPs on attention: the fused CPU SDPA kernels are counted (torch's registry lacks
them), against the textbook count and against torch's own count of the same maths done with
explicit matmuls; compute ops without any formula are listed, never silently 0."""

import pytest
import torch
import torch.nn.functional as F
from rich.console import Console
from torch import nn

from layerlab.cli import render_profile
from layerlab.profiling.run import profile

pytestmark = pytest.mark.usefixtures("one_thread")


class FusedAttention(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


class MatmulAttention(nn.Module):
    """The same maths op by op: torch's counter knows bmm."""

    def forward(self, q, k, v):
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        return scores.softmax(-1) @ v


def _qkv(B, H, L, S, E, Ev):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(*shape, generator=gen).requires_grad_() for shape in
            ((B, H, L, E), (B, H, S, E), (B, H, S, Ev))]


def test_sdpa_forward_is_two_matmuls_and_backward_is_torchs_five():
    B, H, L, S, E, Ev = 2, 3, 16, 24, 8, 8
    fused = profile(FusedAttention(), *_qkv(B, H, L, S, E, Ev), repeats=1, warmup=0)
    plain = profile(MatmulAttention(), *_qkv(B, H, L, S, E, Ev), repeats=1, warmup=0)
    row = fused.rows[0]
    assert row.flops_forward == 2 * B * H * L * S * E + 2 * B * H * L * S * Ev  # Q·Kᵀ, then P·V
    assert row.flops_forward == plain.rows[0].flops_forward  # torch's bmm count of the same maths
    # torch's convention for a fused backward: recompute Q·Kᵀ, then 4 matmuls for dQ, dK, dV, dP
    assert row.flops_backward == 5 * 2 * B * H * L * S * E
    assert fused.flops_not_counted == {} and row.flops_not_counted == {}


def test_multihead_attention_is_projections_plus_attention():
    B, L, E, H = 2, 12, 32, 4
    mha = nn.MultiheadAttention(E, H, batch_first=True)
    x = torch.randn(B, L, E)
    fused = profile(mha, x, x, x, need_weights=False, repeats=1, warmup=0)  # takes the SDPA kernel
    plain = profile(mha, x, x, x, need_weights=True, repeats=1, warmup=0)  # explicit bmm, torch counts it
    projections = 2 * B * L * E * (3 * E) + 2 * B * L * E * E  # in_proj (q, k, v), out_proj
    attention = 4 * B * L * L * E  # over all heads: H · 4 · L · L · (E / H)
    assert fused.totals["flops_forward"] == projections + attention
    assert fused.totals["flops_forward"] == plain.totals["flops_forward"]
    assert fused.flops_not_counted == {}


def test_multihead_attention_fast_path_counts_like_the_slow_path():
    """Frozen and in eval, nn.MultiheadAttention runs one fused op (aten._native_multi_head_attention)."""
    B, L, E, H = 2, 10, 32, 4
    mha = nn.MultiheadAttention(E, H, batch_first=True).eval().requires_grad_(False)
    x = torch.randn(B, L, E)
    fast = profile(mha, x, x, x, repeats=1, warmup=0)
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        slow = profile(mha, x, x, x, repeats=1, warmup=0)  # op by op: linear, bmm
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
    assert fast.backward is False and fast.flops_not_counted == {}
    assert fast.totals["flops_forward"] == 2 * B * L * E * 4 * E + 4 * B * L * L * E
    assert fast.totals["flops_forward"] == slow.totals["flops_forward"]


def test_gpt2_total_is_linear_plus_attention():
    transformers = pytest.importorskip("transformers", reason="Hugging Face models need transformers")
    n_layer, E, B, L = 2, 32, 2, 64
    config = transformers.GPT2Config(n_layer=n_layer, n_embd=E, n_head=4, n_positions=L, vocab_size=97,
                                     bos_token_id=0, eos_token_id=0, use_cache=False)
    torch.manual_seed(0)
    model = transformers.GPT2Model(config).eval()
    report = profile(model, torch.randint(0, 97, (B, L)), repeats=1, warmup=0)
    linear = n_layer * 2 * B * L * E * (3 * E + E + 4 * E + 4 * E)  # c_attn, c_proj, mlp.c_fc, mlp.c_proj
    attention = n_layer * 4 * B * L * L * E
    assert report.totals["flops_forward"] == linear + attention
    assert report.totals["flops_backward"] == 2 * linear + n_layer * 10 * B * L * L * E
    # the attention row's self FLOPs are the attention itself (c_attn, c_proj have their own rows)
    assert report.row("h.0.attn").flops_forward == 4 * B * L * L * E
    assert report.row("h.0.attn.c_attn").flops_forward == 2 * B * L * E * 3 * E
    assert report.flops_not_counted == {} and not any("not counted" in n for n in report.notes)


def test_vit_total_is_patches_linear_plus_attention():
    transformers = pytest.importorskip("transformers", reason="Hugging Face models need transformers")
    n_layer, E, P, size, B = 2, 32, 8, 32, 1
    config = transformers.ViTConfig(hidden_size=E, num_hidden_layers=n_layer, num_attention_heads=4,
                                    intermediate_size=4 * E, image_size=size, patch_size=P)
    torch.manual_seed(0)
    model = transformers.ViTModel(config).eval()
    report = profile(model, torch.randn(B, 3, size, size), repeats=1, warmup=0)
    patches = (size // P) ** 2
    N = patches + 1  # the [CLS] token
    expected = (2 * B * patches * E * 3 * P * P  # patch embedding (a stride-P convolution)
                + n_layer * (2 * B * N * E * 12 * E + 4 * B * N * N * E)
                + 2 * B * E * E)  # pooler on [CLS]
    assert report.totals["flops_forward"] == expected
    assert report.flops_not_counted == {}


@pytest.mark.parametrize("make", [
    lambda: (nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), torch.randn(2, 10, 32)),
    lambda: (nn.Sequential(nn.Embedding(10, 8), nn.LayerNorm(8), nn.GELU()), torch.randint(0, 10, (3, 4))),
    lambda: (nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Upsample(scale_factor=2,
             mode="bilinear"), nn.ConvTranspose2d(4, 2, 3)), torch.randn(2, 3, 8, 8)),
], ids=["transformer-encoder-layer", "embedding-layernorm", "conv-bn-upsample"])
def test_stock_models_have_nothing_uncounted(make):
    model, x = make()
    report = profile(model, x, repeats=1, warmup=0)
    assert report.flops_not_counted == {}, report.flops_not_counted
    assert report.totals["flops_forward"] > 0 or isinstance(model[0], nn.Embedding)


def test_an_op_without_a_formula_is_listed_not_zeroed():
    lstm = nn.LSTM(8, 16)
    report = profile(lstm, torch.randn(5, 2, 8), repeats=1, warmup=0)
    row = report.rows[0]
    if row.flops_forward == 0:  # this build runs LSTM as one fused kernel torch has no formula for
        assert report.flops_not_counted, "a zero-FLOP LSTM must say what went uncounted"
        assert row.flops_not_counted == report.flops_not_counted
        names = ", ".join(f"{op} ×{n}" for op, n in sorted(report.flops_not_counted.items()))
        assert any(f"FLOPs not counted: {names}" in n for n in report.notes)
        assert report.to_dict()["flops_not_counted"] == report.flops_not_counted
        console = Console(width=140, color_system=None, record=True)
        for part in render_profile.report(report):
            console.print(part)
        text = console.export_text()
        assert "0+" in text and "FLOPs not counted: aten." in text
    else:  # a build that decomposes LSTM into matmuls: 4 gates, input and hidden products per step
        T, Bn, I, Hd = 5, 2, 8, 16
        assert row.flops_forward == 2 * T * Bn * 4 * Hd * (I + Hd)
    if torch.backends.mkldnn.is_available():
        assert report.flops_not_counted.get("aten.mkldnn_rnn_layer") == 1

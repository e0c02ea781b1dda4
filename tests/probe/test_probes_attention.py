"""The ``attention`` probe against weights torch itself computes, and its promise not to change results.

Ground truth is never the probe's own formula: nn.MultiheadAttention's returned per-head weights,
aten's reference ``_scaled_dot_product_attention_math`` (which returns the weights), layerlab's
layers' ``last_attn_weights``, and Hugging Face's ``output_attentions``; uniform and one-hot
weights are made by construction (zero q/k projections, huge orthogonal q = k).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import layerlab
from layerlab.probe.probes.attention import AttentionProbe
from layerlab.probe.probes.base import ProbeRun


def _entropy_per_head(weights: torch.Tensor) -> torch.Tensor:
    """(B, H, L, S) weights → mean entropy per head over batch and queries (rows of zeros left out)."""
    w = weights.double()
    ent = -(torch.where(w > 0, w * w.log(), torch.zeros_like(w))).sum(-1)  # (B, H, L)
    live = w.sum(-1) > 0.5
    return (ent * live).sum((0, 2)) / live.sum((0, 2))


class _Sdpa(nn.Module):
    """Model code that calls F.scaled_dot_product_attention itself."""

    def __init__(self, **kwargs) -> None:
        super().__init__()
        self.kwargs = kwargs

    def forward(self, q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **self.kwargs)


def test_mha_zero_query_key_projections_give_log_s_and_masked_keys_are_excluded():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=True)
    with torch.no_grad():  # scores q·k = 0 for every key: uniform over the allowed keys
        mha.in_proj_weight[:32] = 0
        mha.in_proj_bias.zero_()
    x = torch.randn(2, 5, 16)
    row = layerlab.inspect(mha, x, x, x, probes=["attention"]).probe("attention").row("")
    assert row.values["entropy"] == pytest.approx(math.log(5), abs=1e-5)
    assert row.values["uniform"] == 1.0 and row.values["one_key"] == 0.0
    assert row.values["max_weight"] == pytest.approx(0.2, abs=1e-6)
    padding = torch.zeros(2, 5, dtype=torch.bool)
    padding[0, -2:] = True  # sample 0 sees 3 keys, sample 1 all 5
    row = layerlab.inspect(mha, x, x, x, key_padding_mask=padding, probes=["attention"]).probe("attention").row("")
    assert row.values["entropy"] == pytest.approx((math.log(3) + math.log(5)) / 2, abs=1e-5)
    assert row.values["uniform"] == 1.0  # uniform over the allowed keys, not over all 5


@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_per_head_entropy_matches_torchs_own_weights(need_weights):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(24, 3, batch_first=True, dropout=0.3).eval()
    x = torch.randn(3, 7, 24) * 3
    causal = torch.triu(torch.ones(7, 7, dtype=torch.bool), 1)
    with torch.no_grad():
        _, w = mha(x, x, x, attn_mask=causal, need_weights=True, average_attn_weights=False)  # (B, H, L, S)
    report = layerlab.inspect(mha, x, x, x, attn_mask=causal, need_weights=need_weights, mode="train",
                              probes=["attention"])
    row = report.probe("attention").row("")
    # train mode with dropout: the probe reads the weights before dropout, the distribution itself
    assert row.series["entropy/head"] == pytest.approx(_entropy_per_head(w).tolist(), abs=1e-5)
    assert row.series["max w/head"] == pytest.approx(w.amax(-1).mean((0, 2)).tolist(), abs=1e-5)
    assert row.values["heads"] == 3 and row.values["keys"] == 7


def test_sdpa_called_by_model_code_matches_atens_reference_weights_causal_and_gqa():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    model = _Sdpa(is_causal=True, enable_gqa=True, scale=0.7)
    _, w = torch.ops.aten._scaled_dot_product_attention_math(q, k, v, None, 0.0, True, scale=0.7, enable_gqa=True)
    row = layerlab.inspect(model, q, k, v, probes=["attention"]).probe("attention").row("")
    assert row.series["entropy/head"] == pytest.approx(_entropy_per_head(w).tolist(), abs=1e-5)
    assert row.values["heads"] == 4


def test_sdpa_float_mask_and_one_hot_by_construction():
    E = 8  # q = k = 100 · one-hot rows: query i's score is 100²/√8 on key i, 0 elsewhere
    q = (torch.eye(E) * 100).expand(2, 1, E, E).clone()
    v = torch.randn(2, 1, E, 4)
    row = layerlab.inspect(_Sdpa(), q, q, v, probes=["attention"]).probe("attention").row("")
    assert row.values["entropy"] == pytest.approx(0.0, abs=1e-6)
    assert row.values["max_weight"] == pytest.approx(1.0, abs=1e-6)
    assert row.values["one_key"] == 1.0 and row.values["uniform"] == 0.0
    torch.manual_seed(1)
    q, k = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 9, 8)
    mask = torch.randn(5, 9)
    mask[:, 6:] = float("-inf")  # the last 3 keys blocked, the rest biased
    _, w = torch.ops.aten._scaled_dot_product_attention_math(q, k, torch.randn(2, 3, 9, 4), mask)
    row = layerlab.inspect(_Sdpa(), q, k, torch.randn(2, 3, 9, 4), mask, probes=["attention"]).probe("attention").row("")
    assert row.series["entropy/head"] == pytest.approx(_entropy_per_head(w).tolist(), abs=1e-5)
    assert row.values["log_n"] == pytest.approx(math.log(6), abs=1e-6)


def test_layerlabs_own_attention_layers():
    from layerlab.layers.attention import ScaledDotProductAttention
    from layerlab.layers.multihead import MultiheadAttention

    torch.manual_seed(0)
    sdpa = ScaledDotProductAttention(is_causal=True).eval()
    q, k, v = torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
    row = layerlab.inspect(sdpa, q, k, v, probes=["attention"]).probe("attention").row("")
    assert row.series["entropy/head"] == pytest.approx(_entropy_per_head(sdpa.last_attn_weights).tolist(), abs=1e-5)
    mha = MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    report = layerlab.inspect(mha, x, x, x, probes=["attention"])
    row = report.probe("attention").row("")
    assert row.series["entropy/head"] == pytest.approx(_entropy_per_head(mha.last_attn_weights).tolist(), abs=1e-5)
    assert "from softmax" in row.flags


def _run(model, x, probe, train: bool):
    """Forward + backward by hand, with the probe's mode active or not; outputs and grads."""
    model.train(train)
    model.zero_grad(set_to_none=True)
    run = ProbeRun(model, list(model.named_modules()), (x,), {}, True, 0)
    if probe is not None:
        probe.attach(run)
    torch.manual_seed(3)
    try:
        with run.around_forward():
            out = model(x)
        out.backward(torch.ones_like(out))
    finally:
        run.remove()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("train", [True, False])
def test_the_probe_never_changes_outputs_or_gradients(train):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, batch_first=True, dropout=0.2)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    x = torch.randn(2, 9, 32)
    plain_out, plain_grads = _run(model, x, None, train)
    probe = AttentionProbe()
    out, grads = _run(model, x, probe, train)
    assert torch.equal(plain_out, out)
    assert all(torch.equal(a, b) for a, b in zip(plain_grads, grads))
    assert [r.path for r in probe.rows] == ["layers.0.self_attn", "layers.1.self_attn"]


def _tiny_hf(kind: str, attn: str):
    transformers = pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=32, vocab_size=50,
                                         attn_implementation=attn)
        return transformers.GPT2Model(config).eval()
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                     intermediate_size=64, vocab_size=50, max_position_embeddings=32,
                                     attn_implementation=attn)
    return transformers.BertModel(config).eval()


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_hugging_face_sdpa_and_eager_attention_agree_with_output_attentions(kind):
    ids = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[0, -3:] = 0  # padding in the first sample
    eager = _tiny_hf(kind, "eager")
    with torch.no_grad():
        attentions = eager(ids, attention_mask=mask, output_attentions=True).attentions
    rows = {}
    for attn in ("eager", "sdpa"):
        model = _tiny_hf(kind, attn)
        result = layerlab.inspect(model, ids, attention_mask=mask, probes=["attention"]).probe("attention")
        rows[attn] = result.rows
        assert len(result.rows) == 2, (attn, [r.path for r in result.rows])
    for layer, (e, s) in enumerate(zip(rows["eager"], rows["sdpa"])):
        assert e.path == s.path
        truth = _entropy_per_head(attentions[layer]).tolist()
        assert e.series["entropy/head"] == pytest.approx(truth, abs=1e-4)
        # sdpa: the key padding mask may reach SDPA as an additive mask; the allowed keys are the same
        assert s.series["entropy/head"] == pytest.approx(truth, abs=1e-4)
        assert e.values["log_n"] == pytest.approx(s.values["log_n"], abs=1e-5)

"""Which dim of each input is the batch: decided from the shapes and the module's contract, not the
names. Every verdict here is on a module nobody here wrote (torch.nn, Hugging Face BERT from a tiny
config); a wrong batch guess shows up as a false batch-check failure or a false export failure."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from layerlab.checks.case import Arg, Case, batch_layout
from layerlab.checks.report import Status
from layerlab.checks.run import verify

BATCH_CHECKS = ["batch_independence", "batch_consistency"]


def _checks(report):
    return {c.name: c for c in report.checks}


def _transformers():
    return pytest.importorskip("transformers",
                               reason="Hugging Face transformers is not installed (pip install transformers)")


def _tiny_bert():
    transformers = _transformers()
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=100, max_position_embeddings=16)
    torch.manual_seed(0)
    return transformers.BertModel(cfg).eval()


def _padded_batch():
    """Three samples of 7 tokens; sample 1 is padded after 4 tokens (HF mask: 1 = keep, 0 = padding)."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 100, (3, 7), generator=gen)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 4:] = 0
    return ids, mask


# -- Hugging Face attention_mask (B, S): one row per sample -------------------------------------------

def test_bert_attention_mask_is_batched_so_a_padded_sample_passes_batch_consistency():
    bert = _tiny_bert()
    ids, mask = _padded_batch()
    # the padding really matters: without the mask, sample 1's output is different
    with torch.no_grad():
        masked = bert(ids, attention_mask=mask).last_hidden_state[1, :4]
        unmasked = bert(ids).last_hidden_state[1, :4]
    assert not torch.allclose(masked, unmasked, atol=1e-4)
    c = _checks(verify(bert, ids, attention_mask=mask, only=BATCH_CHECKS))["batch_consistency"]
    assert c.status == Status.PASS, c.summary
    B, dims = batch_layout(Case(bert, [Arg("input_ids", ids), Arg("attention_mask", mask, True)], "bert"),
                           [Arg("input_ids", ids), Arg("attention_mask", mask, True)])
    assert (B, dims[id(ids)], dims[id(mask)]) == (3, 0, 0)


def test_bert_on_embeddings_passes_both_batch_checks():
    bert = _tiny_bert()
    _, mask = _padded_batch()
    embeds = torch.randn(3, 7, 32, generator=torch.Generator().manual_seed(1))
    report = verify(bert, inputs_embeds=embeds, attention_mask=mask, only=BATCH_CHECKS)
    assert all(c.status == Status.PASS for c in report.checks), [(c.name, c.summary) for c in report.checks]


class _CentredOverBatch(nn.Module):
    """BERT, then its hidden states centred over the batch: really mixes the samples."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, inputs_embeds, attention_mask):
        h = self.bert(inputs_embeds=inputs_embeds, attention_mask=attention_mask).last_hidden_state
        return h - h.mean(0, keepdim=True)


def test_a_layer_that_mixes_the_batch_still_fails_with_a_batched_mask():
    _, mask = _padded_batch()
    embeds = torch.randn(3, 7, 32, generator=torch.Generator().manual_seed(1))
    checks = _checks(verify(_CentredOverBatch(_tiny_bert()), embeds, mask, only=BATCH_CHECKS))
    assert checks["batch_independence"].status == Status.FAIL, checks["batch_independence"].summary
    assert checks["batch_consistency"].status == Status.FAIL, checks["batch_consistency"].summary


def test_bert_export_variants_grow_the_mask_with_the_batch():
    from layerlab.deploy.run import export_check
    from layerlab.deploy.variants import make_variants

    bert = _tiny_bert()
    ids, mask = _padded_batch()
    variants = {v.name: v for v in make_variants(bert, [Arg("input_ids", ids), Arg("attention_mask", mask, True)])}
    assert [tuple(a.value.shape) for a in variants["batch"].args] == [(4, 7), (4, 7)]
    report = export_check(bert, ids, attention_mask=mask, paths=["compile"])
    assert [(p.path, p.status) for p in report.paths] == [("compile", Status.PASS)], report.paths[0].reason


# -- torch's shared masks stay shared ------------------------------------------------------------------

def test_a_square_causal_mask_stays_shared_when_T_equals_B():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True).eval()
    x = torch.randn(4, 4, 8)  # B = T = 4: the (T, T) mask's shape cannot tell
    causal = nn.Transformer.generate_square_subsequent_mask(4)
    args = [Arg("src", x), Arg("src_mask", causal, True)]
    _, dims = batch_layout(Case(layer, args, "enc"), args)
    assert (dims[id(x)], dims[id(causal)]) == (0, None)
    report = verify(layer, x, src_mask=causal, only=BATCH_CHECKS)
    assert all(c.status == Status.PASS for c in report.checks), [(c.name, c.summary) for c in report.checks]


def test_an_L_by_S_attention_mask_stays_shared_when_L_equals_B_and_key_padding_is_batched():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    q, kv = torch.randn(3, 3, 8), torch.randn(3, 5, 8)  # B = L = 3, S = 5
    attn = torch.zeros(3, 5)
    attn[:, 4] = float("-inf")
    kpm = torch.zeros(3, 5, dtype=torch.bool)
    kpm[2, 3] = True
    args = [Arg("query", q), Arg("key", kv), Arg("value", kv), Arg("attn_mask", attn, True),
            Arg("key_padding_mask", kpm, True)]
    _, dims = batch_layout(Case(mha, args, "mha"), args)
    assert (dims[id(attn)], dims[id(kpm)]) == (None, 0)
    report = verify(mha, q, kv, kv, attn_mask=attn, key_padding_mask=kpm, only=BATCH_CHECKS)
    assert all(c.status == Status.PASS for c in report.checks), [(c.name, c.summary) for c in report.checks]


def test_batch_dims_from_the_user_always_win():
    bert = _tiny_bert()
    ids, mask = _padded_batch()
    args = [Arg("input_ids", ids), Arg("attention_mask", mask, True)]
    _, dims = batch_layout(Case(bert, args, "bert", batch_dims={"attention_mask": None}), args)
    assert dims[id(mask)] is None
    x = torch.randn(3, 6, 6)  # nn.Conv2d reads this as one unbatched image; the user says 3 samples
    args = [Arg("input", x)]
    B, dims = batch_layout(Case(nn.Conv2d(1, 2, 3), args, "conv", batch_dims={"input": 0}), args)
    assert (B, dims[id(x)]) == (3, 0)


# -- unbatched calls have no batch -----------------------------------------------------------------------

def _unbatched_cases():
    torch.manual_seed(0)
    s, e = 5, 8
    kpm = torch.tensor([False, False, False, True, True])
    enc = nn.TransformerEncoderLayer(e, 2, dim_feedforward=16, dropout=0.0)
    dec = nn.TransformerDecoderLayer(e, 2, dim_feedforward=16, dropout=0.0)
    tr = nn.Transformer(e, 2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=16, dropout=0.0)
    return [
        ("MultiheadAttention", nn.MultiheadAttention(e, 2), (torch.randn(s, e),) * 3, {"key_padding_mask": kpm}),
        ("TransformerEncoderLayer", enc, (torch.randn(s, e),), {"src_key_padding_mask": kpm}),
        ("TransformerDecoderLayer", dec, (torch.randn(4, e), torch.randn(s, e)), {"memory_key_padding_mask": kpm}),
        ("Transformer", tr, (torch.randn(s, e), torch.randn(4, e)), {"src_key_padding_mask": kpm}),
        ("Softmax2d", nn.Softmax2d(), (torch.randn(3, 4, 5),), {}),
        ("InstanceNorm1d", nn.InstanceNorm1d(3), (torch.randn(3, 6),), {}),
        ("MaxPool2d", nn.MaxPool2d(2), (torch.randn(3, 6, 6),), {}),
        ("Conv1d", nn.Conv1d(3, 2, 3), (torch.randn(3, 7),), {}),
    ]


@pytest.mark.parametrize("name, module, inputs, kwargs", _unbatched_cases(), ids=[c[0] for c in _unbatched_cases()])
def test_unbatched_calls_skip_the_batch_checks_and_pass_the_rest(name, module, inputs, kwargs):
    module.eval()
    report = verify(module, *inputs, **kwargs)
    checks = _checks(report)
    for check in BATCH_CHECKS:
        assert checks[check].status == Status.SKIP and "unbatched input" in checks[check].summary, checks[check].summary
    assert [(c.name, c.summary) for c in report.checks if c.status == Status.FAIL] == []


def test_softmax2d_batched_still_gets_checked():
    report = verify(nn.Softmax2d(), torch.randn(2, 3, 4, 5), only=BATCH_CHECKS)
    assert all(c.status == Status.PASS for c in report.checks), [(c.name, c.summary) for c in report.checks]

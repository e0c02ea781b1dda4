"""A transformers model built causal (its attention's ``is_causal``, under a ``PreTrainedModel``) must not leak.

The model builds its causal mask itself, so a leak is a FAIL, not the "pass a causal mask" warning
that an attention class called alone gets. A BERT encoder is not causal and is not judged so. The
truth is plain torch: change the id at position 1 and see whether position 0 moves.
"""

from __future__ import annotations

import pytest
import torch

import layerlab
from layerlab.checks.report import Status

T = 6


def _phi3():
    tf = pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")
    cfg = tf.Phi3Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    ids = torch.randint(3, 50, (2, T))
    padding = torch.ones(2, T, dtype=torch.long)
    padding[0, :2] = 0  # both samples padded (left)
    padding[1, :1] = 0
    return tf.Phi3Model(cfg).eval(), ids, padding


def _sees_next(padding: torch.Tensor) -> torch.Tensor:
    """A (B, 1, T, T) additive mask where position t may see t + 1 (and padding blocked): the planted leak."""
    allowed = torch.ones(T, T, dtype=torch.bool).tril(1) & padding.bool()[:, None, None, :]
    return torch.zeros(2, 1, T, T).masked_fill(~allowed, float("-inf"))


def _position0_moves(model, ids, mask) -> float:
    with torch.no_grad():
        base = model(input_ids=ids, attention_mask=mask).last_hidden_state
        ids2 = ids.clone()
        ids2[:, 2] = (ids2[:, 2] + 5) % 50  # position 2: a real token in both samples
        return float((model(input_ids=ids2, attention_mask=mask).last_hidden_state - base)[1, 1].abs().max())


def _causality(model, **inputs):
    report = layerlab.verify(model, only=["causality"], **inputs)
    return report.checks[0], report


@pytest.mark.slow
def test_phi3_with_a_leaky_mask_fails():
    model, ids, padding = _phi3()
    leaky = _sees_next(padding)
    assert _position0_moves(model, ids, leaky) > 1e-4  # truth: position 1 of sample 1 sees position 2
    c, report = _causality(model, input_ids=ids, attention_mask=leaky)
    assert c.status == Status.FAIL and not report.ok, c.summary
    assert c.details["claim"].startswith("`Phi3Model` is a transformers model built causal")
    assert c.details["leaks_from"] == c.details["first_leaking_position"] + 1
    assert "'attention_mask' passed" in c.hint


@pytest.mark.slow
def test_stock_phi3_with_both_samples_padded_passes():
    model, ids, padding = _phi3()
    assert _position0_moves(model, ids, padding) == 0.0  # truth: causal
    c, report = _causality(model, input_ids=ids, attention_mask=padding)
    assert c.status == Status.PASS and report.ok, c.summary


@pytest.mark.slow
def test_phi3_attention_alone_is_still_only_a_warning():
    """Near miss: the attention class called alone with no mask sees the future; its model builds the mask."""
    model, ids, _ = _phi3()
    attn = model.layers[0].self_attn
    x = torch.randn(2, T, 16)
    pos = model.rotary_emb(x, torch.arange(T)[None].expand(2, T))
    c, _ = _causality(attn, hidden_states=x, position_embeddings=pos, attention_mask=None)
    assert c.status in (Status.WARN, Status.PASS), c.summary
    assert c.details["claim"] == "`Phi3Attention.is_causal` is True"  # an attribute, not a model built causal


@pytest.mark.slow
def test_bert_encoder_is_not_judged_causal():
    tf = pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")
    torch.manual_seed(0)
    model = tf.BertModel(tf.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=32)).eval()
    ids = torch.randint(0, 50, (2, T))
    with torch.no_grad():  # truth: an encoder reads the whole sequence
        ids2 = ids.clone()
        ids2[:, -1] = (ids2[:, -1] + 3) % 50
        assert float((model(ids2).last_hidden_state - model(ids).last_hidden_state)[:, 0].abs().max()) > 1e-4
    c, report = _causality(model, input_ids=ids)
    assert c.status == Status.SKIP and report.ok and "does not claim" in c.summary

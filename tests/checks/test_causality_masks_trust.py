"""Trustworthy causality and masks verdicts on real torch modules and Hugging Face models.

Each test builds a stock module (nn.MultiheadAttention, F.scaled_dot_product_attention,
nn.Transformer, GPT-2 from a tiny config) and a mask written the way people get it wrong; the
expected verdict is what torch itself does with that mask (asserted alongside where it matters).
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from layerlab.checks.report import Status
from layerlab.checks.run import verify

T = 6


def one(name, module, *inputs, **kwargs):
    report = verify(module, *inputs, only=[name], **kwargs)
    return report.checks[0]


def _mha():
    torch.manual_seed(0)
    return nn.MultiheadAttention(8, 2, batch_first=True), torch.randn(2, T, 8)


def _bool_triu(k):
    return torch.ones(T, T, dtype=torch.bool).triu(diagonal=k)


class _SDPA(nn.Module):
    """F.scaled_dot_product_attention as a module (bool attn_mask: True = may attend)."""

    def forward(self, query, key, value, attn_mask=None):
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask)


# -- 1. NaN never passes -------------------------------------------------------------------------------

def test_nan_output_on_finite_inputs_fails_with_its_positions():
    mha, x = _mha()
    mask = torch.ones(T, T, dtype=torch.bool).tril()  # SDPA's causal form: MHA reads True = blocked
    with torch.no_grad():
        y = mha.eval()(x, x, x, attn_mask=mask)[0]
    nan_rows = [int(i) for i in torch.nonzero(y.isnan().any(dim=(0, 2))).flatten()]
    assert nan_rows == [T - 1]  # torch: the last query row has every key blocked
    c = one("causality", mha, x, x, x, attn_mask=mask)
    assert c.status == Status.FAIL, c.summary
    assert c.details["nonfinite_positions"] == nan_rows
    assert f"NaN/inf at positions {T - 1} on finite inputs" in c.summary
    assert "inverted" in c.hint and "off by one" not in c.hint


def test_nan_inputs_are_not_a_pass():
    mha, x = _mha()
    x = x.clone()
    x[:, 3] = float("nan")
    mask = nn.Transformer.generate_square_subsequent_mask(T)
    with torch.no_grad():
        y = mha.eval()(x, x, x, attn_mask=mask)[0]
    nan_rows = [int(i) for i in torch.nonzero(y.isnan().any(dim=(0, 2))).flatten()]
    assert nan_rows  # NaN + (−inf) is NaN: the NaN key reaches rows that mask it too
    c = one("causality", mha, x, x, x, attn_mask=mask)
    assert c.status == Status.SKIP and "so do the inputs" in c.summary
    assert c.details["nonfinite_positions"] == nan_rows


# -- 2. near-causal masks are a causal claim, and the hint names the off-by-one ----------------------------

def test_triu_diagonal_2_mask_is_checked_and_fails_as_off_by_one():
    mha, x = _mha()
    c = one("causality", mha, x, x, x, attn_mask=_bool_triu(2))
    assert c.status == Status.FAIL, c.summary
    assert "near-causal" in c.details["claim"]
    assert (c.details["first_leaking_position"], c.details["leaks_from"]) == (0, 1)
    assert "off by one" in c.hint and "triu(…, diagonal=2) instead of diagonal=1" in c.hint
    assert "triu(diagonal=1)" in c.hint
    m = one("masks", mha, x, x, x, attn_mask=_bool_triu(2))
    assert m.status == Status.WARN and "diagonal=2" in m.summary


def test_additive_triu_diagonal_2_mask_fails_too():
    mha, x = _mha()
    mask = torch.zeros(T, T).masked_fill(_bool_triu(2), float("-inf"))
    c = one("causality", mha, x, x, x, attn_mask=mask)
    assert c.status == Status.FAIL and "triu(…, diagonal=2) instead of diagonal=1" in c.hint
    assert "generate_square_subsequent_mask" in c.hint


def test_triu_diagonal_0_masks_the_token_itself_and_row_0_is_nan():
    mha, x = _mha()
    with torch.no_grad():
        y = mha.eval()(x, x, x, attn_mask=_bool_triu(0))[0]
    assert y[:, 0].isnan().all() and not y[:, 1:].isnan().any()  # torch's own result
    c = one("causality", mha, x, x, x, attn_mask=_bool_triu(0))
    assert c.status == Status.FAIL and c.details["nonfinite_positions"] == [0]
    assert "triu(…, diagonal=0) instead of diagonal=1" in c.hint and "masks each token itself" in c.hint
    m = one("masks", mha, x, x, x, attn_mask=_bool_triu(0))
    assert m.status == Status.FAIL and "diagonal=0" in m.hint + m.summary and "NaN" in m.summary


def test_sdpa_tril_diagonal_1_is_off_by_one_in_its_own_convention():
    torch.manual_seed(0)
    q = torch.randn(2, 2, T, 4)  # (B, H, T, E)
    c = one("causality", _SDPA(), q, q, q, attn_mask=torch.ones(T, T, dtype=torch.bool).tril(1))
    assert c.status == Status.FAIL and c.where == "output position 0"
    assert "tril(…, diagonal=1) instead of diagonal=0" in c.hint and "True = attend" in c.hint
    ok = one("causality", _SDPA(), q, q, q, attn_mask=torch.ones(T, T, dtype=torch.bool).tril())
    assert ok.status == Status.PASS, ok.summary


def test_inverted_convention_is_named_as_such_not_off_by_one():
    torch.manual_seed(0)
    q = torch.randn(2, 2, T, 4)
    mha_style = _bool_triu(1)  # nn.MultiheadAttention's causal mask; SDPA reads True = attend
    c = one("causality", _SDPA(), q, q, q, attn_mask=mha_style)
    assert c.status == Status.FAIL, c.summary
    assert "inverted" in c.hint and "off by one" not in c.hint and "tril()" in c.hint
    m = one("masks", _SDPA(), q, q, q, attn_mask=mha_style)
    assert m.status == Status.FAIL and "inverted" in m.summary and "~mask" in m.hint


# -- 3. float 0/1 masks block nothing: a causal or padding one is a bug ----------------------------------

def test_float_01_causal_mask_fails_both_checks_naming_the_float_mask():
    mha, x = _mha()
    keep = torch.ones(T, T).tril()  # 1 = attend, as floats: added to the scores
    later = x.clone()
    later[:, -1] += 1.0
    with torch.no_grad():
        mha.eval()
        row0 = mha(x, x, x, attn_mask=keep)[0][:, 0], mha(later, later, later, attn_mask=keep)[0][:, 0]
    assert not torch.allclose(*row0)  # torch: position 0 still sees the last key
    c = one("causality", mha, x, x, x, attn_mask=keep)
    assert c.status == Status.FAIL and "float 0/1" in c.hint
    assert "off by one" not in c.hint and "inverted" not in c.hint
    assert "mask == 0" in c.hint
    m = one("masks", mha, x, x, x, attn_mask=keep)
    assert m.status == Status.FAIL and "float 0/1 causal mask" in m.summary
    assert "True = blocked: mask == 0" in m.hint


def test_float_01_mask_fix_follows_sdpa_convention():
    torch.manual_seed(0)
    q = torch.randn(2, 2, T, 4)
    m = one("masks", _SDPA(), q, q, q, attn_mask=torch.ones(T, T).tril())
    assert m.status == Status.FAIL and m.details["probe"]["bool_semantics"].startswith("True = attend")
    assert "True = attend: mask == 1" in m.hint


def test_float_01_key_padding_mask_fails():
    mha, x = _mha()
    pad = torch.zeros(2, T)
    pad[1, -2:] = 1.0  # sample 1's last two keys are padding, written as 1.0
    m = one("masks", mha, x, x, x, key_padding_mask=pad)
    assert m.status == Status.FAIL and "float 0/1 padding mask" in m.summary
    assert "attention_mask" in m.hint  # which way 1 points is unknown: both conversions are given


def test_float_mask_that_is_not_a_pattern_only_warns():
    mha, x = _mha()
    torch.manual_seed(1)
    bias = (torch.rand(T, T) > 0.5).float()  # a 0/1 bias, no causal or padding shape
    m = one("masks", mha, x, x, x, attn_mask=bias)
    assert m.status == Status.WARN and "blocks nothing" in m.summary


# -- 4. integer token ids are sequences: GPT-2 ----------------------------------------------------------

def _gpt2():
    transformers = pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=100, n_positions=32,
                                  bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2Model(cfg).eval(), torch.randint(0, 100, (2, 10))


@pytest.mark.parametrize("tags", [["causal"], []])
def test_gpt2_with_input_ids_is_checked_and_causal(tags):
    model, ids = _gpt2()
    c = one("causality", model, ids, tags=tags)
    assert c.status == Status.PASS, c.summary
    assert c.details["sequence_inputs"] == {"input_ids": 1} and c.details["length"] == 10
    assert c.details["token_vocab"] == {"input_ids": "embedding `wte` (100 ids)"}
    if not tags:
        # the attention's flag under a transformers model: the model builds the mask, so a leak would fail
        assert c.details["claim"].startswith("`GPT2Model` is a transformers model built causal (`h.0.attn.is_causal`")


class _ReadsBackwards(nn.Module):
    """GPT-2 run on the reversed ids: position t sees every id after it."""

    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt

    def forward(self, input_ids):
        return self.gpt(input_ids.flip(1)).last_hidden_state.flip(1)


def test_non_causal_gpt2_variant_fails():
    model, ids = _gpt2()
    c = one("causality", _ReadsBackwards(model), ids, tags=["causal"])
    assert c.status == Status.FAIL, c.summary
    assert (c.details["first_leaking_position"], c.details["leaks_from"]) == (0, 1)
    assert c.details["sees_beyond_next"] is True and "further ahead" in c.hint
    # the flipped ids never reach the embedding as given: the vocabulary comes from the config
    assert c.details["token_vocab"] == {"input_ids": "config.vocab_size = 100"}


# -- 5. encoder-decoder: the causal claim is about tgt --------------------------------------------------

def _transformer():
    torch.manual_seed(0)
    model = nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32,
                           batch_first=True)
    return model, torch.randn(2, T, 16), torch.randn(2, T, 16)


def test_transformer_with_causal_tgt_mask_passes():
    model, src, tgt = _transformer()
    c = one("causality", model, src, tgt, tgt_mask=nn.Transformer.generate_square_subsequent_mask(T))
    assert c.status == Status.PASS, c.summary
    assert c.details["sequence_inputs"] == {"tgt": 1}


def test_transformer_with_off_by_one_tgt_mask_fails():
    model, src, tgt = _transformer()
    c = one("causality", model, src, tgt, tgt_mask=_bool_triu(2))
    assert c.status == Status.FAIL, c.summary
    assert c.details["sequence_inputs"] == {"tgt": 1}
    assert "tgt_mask" in c.hint and "triu(…, diagonal=2) instead of diagonal=1" in c.hint


def test_transformer_causal_src_mask_alone_is_not_a_claim_about_the_output():
    model, src, tgt = _transformer()
    c = one("causality", model, src, tgt, src_mask=nn.Transformer.generate_square_subsequent_mask(T))
    assert c.status == Status.SKIP and "cross-attention" in c.summary


def test_a_triangular_key_padding_mask_is_not_a_causal_claim():
    torch.manual_seed(0)
    mha, x = nn.MultiheadAttention(8, 2, batch_first=True), torch.randn(4, 4, 8)
    lengths_1_to_4 = torch.ones(4, 4, dtype=torch.bool).triu(1)  # (B, S), True = padding: a triangle by chance
    c = one("causality", mha, x, x, x, key_padding_mask=lengths_1_to_4)
    assert c.status == Status.SKIP and "does not claim" in c.summary


class _FlippedEmbedding(nn.Module):
    """An embedding read right to left: nothing names the vocabulary of the ids it is given."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 4)

    def forward(self, input_ids):
        return self.emb(input_ids.flip(-1)).cumsum(1).flip(1)


def test_token_vocab_falls_back_to_the_largest_id_seen():
    torch.manual_seed(0)
    ids = torch.randint(0, 30, (2, 7))
    c = one("causality", _FlippedEmbedding(), ids, tags=["causal"])
    assert c.status == Status.FAIL, c.summary  # a reversed cumulative sum: position t sums ids t..T−1
    top = int(ids.max()) + 1
    assert c.details["token_vocab"] == {"input_ids": f"the largest id seen + 1 = {top} (no embedding or config "
                                                     "names the vocabulary)"}

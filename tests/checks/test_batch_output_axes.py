"""Every output of a batched call is checked or listed: batched, pairwise (B, B), or a lost batch axis.

SigLIP's ``logits_per_text`` / ``logits_per_image`` are (B, B): entry (i, j) compares text i with
image j. They are checked as pairwise (each input feeds one axis, measured), so a planted read of
another sample fails; the stock model passes. A batch-first GRU's ``out[-1]`` (the last *sample*)
is a finding, not a skip. The truth in every test is plain torch: replace one sample, see what moves.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerlab
from layerlab.checks.report import Status

BATCH_CHECKS = ["batch_independence", "batch_consistency"]


def _checks(model, *args, **inputs):
    report = layerlab.verify(model, *args, only=BATCH_CHECKS, **inputs)
    return {c.name: c for c in report.checks}, report


def _siglip():
    tf = pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")
    cfg = tf.SiglipConfig(
        text_config=dict(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=8),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=8, patch_size=4, num_channels=3))
    torch.manual_seed(0)
    model = tf.SiglipModel(cfg).eval()
    return model, torch.randint(0, 50, (3, 6)), torch.randn(3, 3, 8, 8)


def _moves(model, ids, px, which: str, k: int) -> torch.Tensor:
    """Plain torch: |Δ logits_per_text| when sample k of one input is replaced."""
    with torch.no_grad():
        base = model(input_ids=ids, pixel_values=px)["logits_per_text"]
        ids2, px2 = ids.clone(), px.clone()
        if which == "pixel_values":
            px2[k] = torch.randn_like(px2[k])
        else:
            ids2[k] = (ids2[k] + 7) % 50
        return (model(input_ids=ids2, pixel_values=px2)["logits_per_text"] - base).abs()


class _LogitsReadLastImage(nn.Module):
    """SigLIP whose ``logits_per_text[0]`` also reads the last image: outside the pairwise structure."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, pixel_values):
        out = self.model(input_ids=input_ids, pixel_values=pixel_values)
        per_text = out.logits_per_text.clone()
        per_text[0] = per_text[0] + pixel_values[-1].mean()
        return {"logits_per_text": per_text, "logits_per_image": out.logits_per_image}


class _TextTowerMixes(nn.Module):
    """A SigLIP-style dual encoder whose text tower adds the batch mean of the text embeddings."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, pixel_values):
        text = self.model.get_text_features(input_ids=input_ids)
        image = self.model.get_image_features(pixel_values=pixel_values)
        text, image = (getattr(t, "pooler_output", t) for t in (text, image))
        text = text + text.mean(0, keepdim=True)
        text, image = text / text.norm(dim=-1, keepdim=True), image / image.norm(dim=-1, keepdim=True)
        return text @ image.T


@pytest.mark.slow
def test_stock_siglip_checks_its_b_by_b_logits_as_pairwise():
    model, ids, px = _siglip()
    # truth: pixel sample 1 moves column 1 of logits_per_text and nothing else; text sample 1 moves row 1
    moved = _moves(model, ids, px, "pixel_values", 1) > 1e-9
    assert moved[:, 1].all() and not moved[:, [0, 2]].any()
    moved = _moves(model, ids, px, "input_ids", 1) > 1e-9
    assert moved[1].all() and not moved[[0, 2]].any()
    checks, report = _checks(model, input_ids=ids, pixel_values=px)
    ind = checks["batch_independence"]
    assert ind.status == Status.PASS and report.ok, ind.summary
    pair = ind.details["pairwise"]
    assert pair["output['logits_per_text']"]["input_axis"] == {"input_ids": 0, "pixel_values": 1}
    assert pair["output['logits_per_image']"]["input_axis"] == {"input_ids": 1, "pixel_values": 0}
    assert "logits_per_text'] is pairwise over the batch (B, B)" in ind.summary
    assert ind.details["outputs"]["no_batch_axis"] == {}
    assert "compared at (i, i)" in checks["batch_consistency"].summary


@pytest.mark.slow
def test_siglip_logits_reading_another_image_fails_as_pairwise():
    model, ids, px = _siglip()
    planted = _LogitsReadLastImage(model)
    with torch.no_grad():  # truth: logits_per_text[0, 0] moves when image 2 changes (its column is 0)
        base = planted(ids, px)["logits_per_text"]
        px2 = px.clone()
        px2[2] = torch.randn_like(px2[2])
        assert abs(float(planted(ids, px2)["logits_per_text"][0, 0] - base[0, 0])) > 1e-3
    checks, report = _checks(planted, input_ids=ids, pixel_values=px)
    ind = checks["batch_independence"]
    assert ind.status == Status.FAIL and not report.ok, ind.summary
    leak = ind.details["leaks"][0]
    assert leak["output"] == "output['logits_per_text']" and leak["input"] == "pixel_values"
    assert leak["other_sample"] == 2 and leak["entry"][0] == 0 and leak["entry"][1] != 2
    assert "outside its row and column" in ind.summary


@pytest.mark.slow
def test_siglip_style_text_tower_that_mixes_samples_fails():
    model, ids, px = _siglip()
    planted = _TextTowerMixes(model)
    with torch.no_grad():  # truth: text sample 0 moves logits of text 1 (row 1)
        base = planted(ids, px)
        ids2 = ids.clone()
        ids2[0] = (ids2[0] + 7) % 50
        assert float((planted(ids2, px) - base)[1].abs().max()) > 1e-4
    checks, _ = _checks(planted, input_ids=ids, pixel_values=px)
    ind = checks["batch_independence"]
    assert ind.status == Status.FAIL, ind.summary
    assert ind.details["leaks"][0]["input"] == "input_ids"


class _LastOfGRU(nn.Module):
    def __init__(self, index_sample: bool):
        super().__init__()
        self.gru = nn.GRU(5, 8, batch_first=True)
        self.index_sample = index_sample

    def forward(self, x):
        out, _ = self.gru(x)
        return out[-1] if self.index_sample else out[:, -1]  # out[-1] is the last sample, not the last step


@pytest.mark.parametrize("B", [4, 6])
def test_gru_out_minus_one_loses_the_batch_axis_and_fails(B):
    torch.manual_seed(0)
    model, x = _LastOfGRU(True), torch.randn(B, 7, 5)
    with torch.no_grad():  # truth: only the last sample moves the output
        x2 = x.clone()
        x2[0] += 1
        assert torch.equal(model(x2), model(x))
        x2 = x.clone()
        x2[-1] += 1
        assert not torch.equal(model(x2), model(x))
    checks, report = _checks(model, x=x)
    ind = checks["batch_independence"]
    assert ind.status == Status.FAIL and not report.ok
    assert ind.summary.startswith("the output lost the batch axis:")
    assert ind.details["samples_read"] == {"x": [B - 1]}
    assert "out[:, -1]" in ind.hint


def test_gru_last_step_passes():
    torch.manual_seed(0)
    checks, report = _checks(_LastOfGRU(False), x=torch.randn(4, 7, 5))
    assert report.ok and checks["batch_independence"].status == Status.PASS


def test_a_mean_loss_reduces_over_the_batch_by_design():
    torch.manual_seed(0)
    checks, _ = _checks(nn.MSELoss(), torch.randn(4, 3), torch.randn(4, 3))
    assert checks["batch_independence"].status == Status.SKIP
    assert "reduction='mean'" in checks["batch_independence"].summary


class _BatchMean(nn.Module):
    def forward(self, x):
        return x.mean(0)


def test_an_output_that_reduces_the_batch_is_a_warning_that_says_so():
    torch.manual_seed(0)
    checks, _ = _checks(_BatchMean(), x=torch.randn(4, 3))
    ind = checks["batch_independence"]
    assert ind.status == Status.WARN and ind.summary.startswith("the output lost the batch axis:")
    assert "every sample moves it" in ind.summary


class _Gram(nn.Module):
    """A (B, B) similarity of one input with itself: entry (i, j) reads samples i and j of the same input."""

    def __init__(self, leak: bool):
        super().__init__()
        self.proj = nn.Linear(4, 3)
        self.leak = leak

    def forward(self, x):
        z = self.proj(x)
        if self.leak:
            z = z + z.mean(0, keepdim=True)  # every sample reads every other
        return z @ z.T


@pytest.mark.parametrize("leak", [False, True])
def test_a_gram_matrix_feeds_both_axes_and_a_mixed_one_fails(leak):
    torch.manual_seed(0)
    model, x = _Gram(leak), torch.randn(4, 4)
    with torch.no_grad():  # truth: does entry (2, 3) move when sample 0 changes?
        x2 = x.clone()
        x2[0] += 1
        moved = float((model(x2) - model(x))[2, 3].abs())
    assert (moved > 1e-6) == leak
    ind = _checks(model, x)[0]["batch_independence"]
    assert ind.status == (Status.FAIL if leak else Status.PASS), ind.summary
    if not leak:
        assert ind.details["pairwise"]["output"]["input_axis"] == {"x": "both"}

"""The four cases an independent audit of ``inspect`` left with torch's message only, or with no
verified fix: float class labels into cross-entropy, channels-last pixels into a Hugging Face ViT,
an einsum operand with its head axis in the wrong place, and an (N, S) padding mask passed to
``F.scaled_dot_product_attention``. Each asserts the blamed location, the cause, the exact fix and
— for verified fixes — that the fixed copy computes exactly what the model fixed by hand computes
(same weights); the tempting wrong fix (flipping the mask, transposing the other einsum operand,
setting num_channels) is never the fix.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import layerlab
from layerlab.probe.fixes import apply_fixes


def _diagnose(model, *args, **kwargs):
    report = layerlab.inspect(model, *args, **kwargs)
    assert not report.ok and report.failure is not None and report.failure.diagnosis is not None
    return report.failure, report.failure.diagnosis


def _fixed(model, d, *args, **kwargs):
    assert d.verified is not None and d.verified.status == "runs", d.verified
    return apply_fixes(model, d.verified.steps)(*args, **kwargs)


def _line(fn, text: str) -> int:
    import inspect as pyinspect

    lines, start = pyinspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


# -- cross-entropy given class indices stored as float ----------------------------------------------
class LossModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x, target):
        return self.loss(self.fc(x), target)


class LossFunctional(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x, target):
        return F.cross_entropy(self.fc(x), target)


def test_cross_entropy_loss_module_with_float_labels_gets_target_long():
    torch.manual_seed(0)
    model, x, y = LossModule(), torch.randn(4, 4), torch.tensor([0., 2., 1., 1.])
    with pytest.raises(RuntimeError, match="Long"):
        model(x, y)
    failure, d = _diagnose(model, x, y)
    assert failure.path == "loss" and d.cause == "target-dtype"
    assert "holds class indices (whole numbers in 0..2) stored as float" in d.message
    assert (d.fix.kind, d.fix.where, d.fix.code) == ("cast-input", "loss", "target.long()")
    torch.testing.assert_close(_fixed(model, d, x, y), model(x, y.long()), rtol=0, atol=0)


def test_functional_cross_entropy_with_float_labels_is_fixed_at_its_line():
    torch.manual_seed(0)
    model, x, y = LossFunctional(), torch.randn(3, 4), torch.tensor([0., 2., 1.])
    failure, d = _diagnose(model, x, y)
    line = _line(LossFunctional.forward, "F.cross_entropy")
    assert failure.op is not None and failure.op.op == "F.cross_entropy" and d.cause == "target-dtype"
    assert (d.fix.kind, d.fix.code, d.fix.params["line"]) == ("replace-op", "target.long()", line)
    torch.testing.assert_close(_fixed(model, d, x, y), model(x, y.long()), rtol=0, atol=0)


def test_probability_targets_are_not_flagged():
    torch.manual_seed(0)
    model, x = LossFunctional(), torch.randn(3, 4)
    probs = torch.softmax(torch.randn(3, 3), dim=1)  # (N, C), rows sum to 1: a valid soft target
    assert layerlab.inspect(model, x, probs).ok
    bad = torch.softmax(torch.randn(3, 5), dim=1)  # probabilities over 5 classes for a 3-class head
    report = layerlab.inspect(model, x, bad)
    assert not report.ok
    d = report.failure.diagnosis
    assert d is None or d.cause != "target-dtype"


def test_float_labels_that_are_not_class_indices_get_no_cast():
    torch.manual_seed(0)
    model, x = LossFunctional(), torch.randn(3, 4)
    _, d = _diagnose(model, x, torch.tensor([0.3, 2.0, 1.5]))
    assert d.cause == "target-dtype" and d.fix is None and "not class indices 0..2" in d.message


# -- NHWC pixels into a Hugging Face ViT --------------------------------------------------------------
@pytest.mark.parametrize("ops", [False, True])  # with --ops the failure is not replayed: the root's own arguments
def test_vit_fed_channels_last_pixels_gets_the_permute_of_pixel_values(ops):
    transformers = pytest.importorskip("transformers", reason="the ViT case needs Hugging Face transformers")
    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=16, patch_size=8, num_channels=3, hidden_size=16, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=32)
    model = transformers.ViTModel(config).eval()
    pixels = torch.randn(2, 16, 16, 3)
    failure, d = _diagnose(model, pixels, ops=ops)
    assert failure.path == "embeddings.patch_embeddings" and d.cause == "layout"
    assert "channels-last" in d.message
    assert (d.fix.kind, d.fix.where, d.fix.code) == ("permute-input", "", "pixel_values.permute(0, 3, 1, 2)")
    assert d.alternatives[0].startswith("not num_channels=16")  # the size fix would read rows as channels
    got = _fixed(model, d, pixels).last_hidden_state
    want = model(pixels.permute(0, 3, 1, 2)).last_hidden_state
    torch.testing.assert_close(got, want, rtol=0, atol=0)


# -- einsum with the head axis in the wrong place ------------------------------------------------------
class EinsumScores(nn.Module):
    def __init__(self, heads: int = 2, dim: int = 8):
        super().__init__()
        self.heads = heads
        self.q, self.k = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.hand_fixed = False

    def forward(self, x):
        B, S, E = x.shape
        q = self.q(x).view(B, S, self.heads, E // self.heads).transpose(1, 2)  # (b, h, q, d)
        k = self.k(x).view(B, S, self.heads, E // self.heads)  # (b, k, h, d): its transpose is missing
        if self.hand_fixed:
            k = k.transpose(1, 2)
        return torch.einsum("bhqd,bhkd->bhqk", q, k)


def test_einsum_operand_with_heads_on_the_wrong_axis_is_transposed():
    torch.manual_seed(0)
    model, x = EinsumScores(), torch.randn(3, 5, 8)
    failure, d = _diagnose(model, x)
    assert failure.op is not None and failure.op.op == "einsum" and d.cause == "inner-dim"
    assert "subscript h is 2 in q and 5 in k" in d.message and "k is laid out 'bkhd', not 'bhkd'" in d.message
    line = _line(EinsumScores.forward, "torch.einsum")
    assert (d.fix.kind, d.fix.code, d.fix.params["line"]) == ("replace-op", "k.transpose(1, 2)", line)
    # q.transpose(1, 2) makes the sizes agree too (5 "heads" of 2 positions): it undoes the user's own
    # transpose, so it is named as the wrong one, never offered
    assert d.alternatives == [f"not q.transpose(1, 2): it would undo the axis order you chose at "
                              f"{failure.op.source.rsplit(':', 1)[0]}:{_line(EinsumScores.forward, 'E // self.heads).transpose')}"]
    hand = copy.deepcopy(model)
    hand.hand_fixed = True
    torch.testing.assert_close(_fixed(model, d, x), hand(x), rtol=0, atol=0)


def test_einsum_with_two_fitting_axis_orders_offers_none():
    torch.manual_seed(0)
    model, x = EinsumScores(heads=4, dim=16), torch.randn(3, 5, 16)  # h = d = 4: the sizes can't tell them apart
    _, d = _diagnose(model, x)
    assert d.cause == "inner-dim" and d.fix is None and d.verified is None
    assert "axis orders make the sizes agree" in d.hint and "k.transpose(1, 2)" in d.hint and "k.permute(0, 3, 1, 2)" in d.hint


# -- SDPA with an (N, S) padding mask --------------------------------------------------------------
class SdpaBlock(nn.Module):
    def __init__(self, hand_fixed: bool = False):
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.hand_fixed = hand_fixed

    def forward(self, x, mask):
        B, S, _ = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, 2, 4).permute(2, 0, 3, 1, 4)
        if self.hand_fixed:
            mask = (mask != 0)[:, None, None, :] if not mask.is_floating_point() else mask[:, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _padding(lengths, S):
    return torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]  # True = a real token


def test_sdpa_padding_mask_is_reshaped_keeping_true_as_attend():
    torch.manual_seed(0)
    model, x = SdpaBlock(), torch.randn(3, 6, 8)
    mask = _padding([6, 4, 2], 6)
    failure, d = _diagnose(model, x, mask)
    assert failure.op.op == "F.scaled_dot_product_attention" and d.cause == "mask-shape"
    line = _line(SdpaBlock.forward, "F.scaled_dot_product_attention")
    assert (d.fix.kind, d.fix.code, d.fix.params["line"]) == ("replace-op", "mask[:, None, None, :]", line)
    assert d.alternatives[-1].startswith("~mask only if its True marks padding")
    hand = copy.deepcopy(model)
    hand.hand_fixed = True
    got = _fixed(model, d, x, mask)
    torch.testing.assert_close(got, hand(x, mask), rtol=0, atol=0)
    assert not torch.allclose(got, hand(x, ~mask))  # the flipped mask computes something else


def test_sdpa_integer_padding_mask_is_cast_then_reshaped():
    torch.manual_seed(0)
    model, x = SdpaBlock(), torch.randn(3, 6, 8)
    mask = _padding([6, 4, 2], 6).long()  # Hugging Face's attention_mask: 1 = a real token
    _, d = _diagnose(model, x, mask)
    assert d.cause == "mask-dtype" and d.fix.code == "mask.bool()"
    assert [s.code for s in d.verified.steps] == ["mask.bool()", "mask[:, None, None, :]"]
    hand = copy.deepcopy(model)
    hand.hand_fixed = True
    torch.testing.assert_close(_fixed(model, d, x, mask), hand(x, mask), rtol=0, atol=0)


def test_sdpa_padding_mask_mostly_false_gets_no_fix():
    torch.manual_seed(0)
    model, x = SdpaBlock(), torch.randn(3, 6, 8)
    mask = ~_padding([6, 5, 5], 6)  # True = padding (key_padding_mask's convention): mostly False
    _, d = _diagnose(model, x, mask)
    assert d.cause == "mask-shape" and d.fix is None and d.verified is None
    assert "~mask[:, None, None, :] if True marks padding" in d.hint

"""Round-4 audit of ``layerlab inspect``'s failure blame, as regression tests.

Each broken model of :mod:`tests.probe.audit_round4_models` must be blamed at the right place, for
the right cause, with the right *first* fix — and where that fix is mechanical, the copy it fixes
(``apply_fixes`` with the verified steps) must compute what the hand-fixed model computes with the
same weights. The tempting wrong fix of each case (a resize that makes the error vanish while the
model computes something else) must not be the first suggestion.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional, Tuple

import pytest
import torch

import layerlab
from layerlab.probe.fixes import apply_fixes
from tests.probe.audit_round4_models import CASES

HF = {"hf_vit_nhwc", "hf_vit_gray", "hf_bert_token_type", "hf_onehot_labels"}


@dataclass
class Want:
    path: str                      # the failing module call ('' = the root, when an op raised)
    cause: str
    code: Optional[str]            # the first fix's code; None = no mechanical fix
    op: Optional[str] = None       # the op of the model's code that raised
    fixed_inputs: bool = False     # the hand fix changes the inputs (the model stays)
    wrong: Tuple[str, ...] = ()    # tempting fixes that must not come first
    hint: Optional[str] = None     # a phrase the hint must hold (fixes given as text)


WANT = {
    "unet_odd": Want("", "size", "output_size=[33, 33]", op="cat"),
    "vae_size": Want("mu", "input-size", None, hint="feed 28×28 images", wrong=("in_features=4096",)),
    "seq2seq_hidden": Want("decoder", "size", "hidden_size=128", hint="not torch.zeros"),
    "gru_tbc": Want("", "layout", "x.transpose(0, 1)", op="F.cross_entropy"),
    "mha_pad_as_attn_mask": Want("attn", "mask-shape", "key_padding_mask=attn_mask"),
    "float_keep_mask_fill": Want("", "mask-dtype", "mask == 0", op="masked_fill", wrong=("mask.bool()",)),
    "sdpa_kpm": Want("", "mask-shape", "~key_padding_mask[:, None, None, :]", op="F.scaled_dot_product_attention",
                     wrong=("key_padding_mask[:, None, None, :]", "mask[:, None, None, :]")),
    "view_after_permute": Want("", "non-contiguous", "reshape", op="view"),
    "stack_vs_cat": Want("", "size", "torch.cat(…, dim=1)", op="stack"),
    "squeeze_batch1": Want("", "rank", "f.flatten(1)", op="cat"),
    "emb_float_ids": Want("0", "dtype", "x.long()", fixed_inputs=True),
    "emb_out_of_range": Want("emb", "index-range", "num_embeddings=120"),
    "ce_btc": Want("", "layout", "logits.transpose(1, 2)", op="F.cross_entropy", wrong=("out_features=7",)),
    "ce_onehot_shape": Want("", "loss-target", "target.squeeze(1)", op="F.cross_entropy"),
    "bce_int_target": Want("", "dtype", "target.float()", op="F.binary_cross_entropy_with_logits"),
    "conv_gray_no_channel": Want("0", "rank", "x.unsqueeze(1)", fixed_inputs=True, wrong=("in_channels=4",)),
    "linear_on_nchw": Want("3", "rank", "x.flatten(1)", wrong=("in_features=8",)),
    "groupnorm_36": Want("1", "size", "num_groups=6, num_channels=36", wrong=("num_channels=36",)),
    "modulelist_index": Want("layers.2", "call-order", None, hint="indexes layers", wrong=("in_features=64",)),
    "depthwise_width": Want("dw", "size", "in_channels=96, out_channels=96, groups=96", wrong=("in_channels=96",)),
    "pool_to_zero": Want("7", "size", None, hint="16×16"),
    "pos_emb_short": Want("", "broadcast", None, op="add", hint="max_len ≥ 20"),
    "hf_vit_nhwc": Want("embeddings.patch_embeddings", "layout", "pixel_values.permute(0, 3, 1, 2)",
                        fixed_inputs=True, wrong=("num_channels=16",)),
    "hf_vit_gray": Want("embeddings.patch_embeddings", "size", "pixel_values.expand(-1, 3, -1, -1)",
                        fixed_inputs=True),
    "hf_bert_token_type": Want("embeddings.token_type_embeddings", "index-range", "num_embeddings=3"),
    "hf_onehot_labels": Want("", "loss-target", "labels.argmax(-1)", op="F.cross_entropy", fixed_inputs=True,
                             wrong=("labels.float()",)),
}


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    return out[0]  # a tuple, or a Hugging Face ModelOutput (loss first when there is one)


def _inspect(name):
    if name in HF:
        pytest.importorskip("transformers", reason="the Hugging Face cases need transformers")
    model, args, kwargs = CASES[name](False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model, args, kwargs, layerlab.inspect(model, *args, backward=False, **kwargs)


@pytest.mark.parametrize("name", sorted(WANT))
def test_blame(name):
    want = WANT[name]
    model, args, kwargs, report = _inspect(name)
    failure = report.failure
    assert failure is not None, name
    assert failure.path == want.path, failure.message
    assert (failure.op.op if failure.op is not None else None) == want.op, failure.message
    d = failure.diagnosis
    assert d is not None, failure.message
    assert d.cause == want.cause, d.message
    assert (d.fix.code if d.fix is not None else None) == want.code, d.message
    for wrong in want.wrong:
        assert d.fix is None or d.fix.code != wrong, d.message
    if want.hint is not None:
        assert want.hint in d.hint, d.hint
    if want.code is not None:
        assert d.verified is not None and d.verified.status == "runs", d.verified


def _load_same_weights(hand: torch.nn.Module, fixed: torch.nn.Module) -> None:
    """The fixed copy's weights into the hand-fixed model (by name, or in order when a fix inserted a
    parameter-free layer and shifted the names)."""
    source, target = fixed.state_dict(), hand.state_dict()
    if source.keys() != target.keys():
        assert [v.shape for v in source.values()] == [v.shape for v in target.values()]
        source = dict(zip(target.keys(), source.values()))
    hand.load_state_dict(source)


@pytest.mark.parametrize("name", sorted(n for n, w in WANT.items() if w.code is not None))
def test_fixed_copy_computes_what_the_hand_fix_computes(name):
    model, args, kwargs, report = _inspect(name)
    fixed = apply_fixes(model, report.failure.diagnosis.verified.steps)
    hand, hand_args, hand_kwargs = CASES[name](True)
    if not WANT[name].fixed_inputs:
        hand_args, hand_kwargs = args, kwargs  # the same inputs; the hand fix is in the model
    _load_same_weights(hand, fixed.model)
    fixed.eval(), hand.eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _first_tensor(fixed(*args, **kwargs))
        expected = _first_tensor(hand(*hand_args, **hand_kwargs))
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected)


def test_a_tempting_fix_really_is_wrong():
    """The depthwise case's tempting fix (in_channels=96 alone, then project in_channels=16) runs —
    which is why it must not be offered: the result is not the depthwise block."""
    model, args, _ = CASES["depthwise_width"](False)
    model.dw = torch.nn.Conv2d(96, 16, 3, padding=1, groups=16)
    model.project = torch.nn.Conv2d(16, 24, 1)
    assert model(*args).shape == (2, 24, 8, 8)  # it runs …
    assert model.dw.weight.shape[1] == 6        # … mixing 6 channels per output: not depthwise


def test_stacking_two_scales_is_not_turned_into_cat():
    """Two conv scales stacked and averaged per scale: nothing takes the joined size, so cat (which would
    run and average across the scales) is not offered."""

    class Scales(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = torch.nn.Conv1d(4, 8, 3), torch.nn.Conv1d(4, 8, 5)

        def forward(self, x):
            return torch.stack([self.c1(x), self.c2(x)], dim=1).mean(-1)

    d = layerlab.inspect(Scales(), torch.randn(2, 4, 12), backward=False).failure.diagnosis
    assert d.fix is None, d.message


def test_a_sequential_run_in_order_keeps_the_size_fix():
    """The call-order rule needs earlier siblings that never ran: a plain Sequential head keeps in_features."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    d = layerlab.inspect(model, torch.randn(2, 8), backward=False).failure.diagnosis
    assert d.cause == "size" and d.fix.code == "in_features=16", d.message


def test_a_classifier_head_keeps_its_in_features_fix():
    """Built for another image size, but nothing else derives from that size: the one Linear is the fix."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, 2, 1), torch.nn.Flatten(), torch.nn.Linear(8 * 14 * 14, 10))
    d = layerlab.inspect(model, torch.randn(2, 1, 32, 32), backward=False).failure.diagnosis
    assert d.fix.code == "in_features=2048" and d.verified.status == "runs", d.message

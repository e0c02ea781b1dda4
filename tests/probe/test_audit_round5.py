"""Round-5 audit of ``layerlab inspect``'s failure blame (cases in :mod:`tests.probe.audit_round5_models`).

The text CNN pooled over the wrong axis is fixed: the blame is the reduction's ``dim``, not the
``in_features=L`` that would run and tie the model to one sequence length. The others are misses,
recorded as strict xfails with the first fix they should get.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import layerlab
from layerlab.probe.fixes import apply_fixes
from tests.probe.audit_round5_models import CASES, inputs


def _inspect(name):
    torch.manual_seed(0)
    model = CASES[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = layerlab.inspect(model, *inputs(name), backward=False)
    assert report.failure is not None, f"{name} should fail"
    return model, report.failure


def test_text_cnn_pooled_over_filters_gets_the_reduction_dim_not_in_features():
    model, failure = _inspect("text_cnn")
    d = failure.diagnosis
    assert (failure.path, failure.class_name) == ("fc", "Linear")
    assert d.cause == "reduce-dim"
    assert d.fix.kind == "replace-op" and d.fix.code == "max(…, dim=2)"
    assert "in_features=18" not in d.hint
    assert d.verified.status == "runs" and d.verified.outputs == [[2, 4]]
    hand = CASES["text_cnn"](fixed=True)
    hand.load_state_dict(model.state_dict())
    (ids,) = inputs("text_cnn")
    fixed = apply_fixes(model, d.verified.steps)
    torch.testing.assert_close(fixed(ids), hand(ids))
    longer = torch.randint(0, 50, (2, 31))  # the right fix does not depend on the sequence length
    torch.testing.assert_close(fixed(longer), hand(longer))


def test_reduction_with_two_fitting_axes_is_not_rewritten():
    """(N, C, H, W).mean(dim=1) → Linear(C): no other reduction gives C last, so no dim is proposed."""
    class Pool(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.fc = torch.nn.Conv2d(3, 6, 1), torch.nn.Linear(6, 2)

        def forward(self, x):
            return self.fc(self.conv(x).mean(dim=1))

    torch.manual_seed(0)
    report = layerlab.inspect(Pool(), torch.randn(2, 3, 5, 5), backward=False)
    assert report.failure.diagnosis is None or report.failure.diagnosis.cause != "reduce-dim"


_MISSES = [
    ("mixer", "token_mix", "in_features=16",
     "no mechanical fix: says it cannot tell the transpose from the layer size (see the test below); "
     "Linear(16, 16) is right"),
    ("swin", "", "F.pad",
     "view element count only; 14 is not divisible by window 4 — pad H, W to 16 first"),
    ("bmm", "", "transpose(0, 1)",
     "batch dims 2 vs 5, no fix; k from a seq-first GRU needs k.transpose(0, 1)"),
    ("emb_trailing_one", "rnn", "x.squeeze(2)",
     "says 'reshape the input to 3-D' without a fix; the size-1 axis from the (B, T, 1) ids should be squeezed"),
    ("seq2seq", "dec.multihead_attn", "transpose(0, 1)",
     "no diagnosis; memory (B, S, E) from a batch_first GRU into a seq-first decoder needs memory.transpose(0, 1)"),
    ("seg", "", "F.interpolate",
     "no diagnosis for logits [2, 4, 8, 8] vs mask [2, 16, 16]; upsample logits to the mask size"),
]


# each miss is a strict xfail, its evidence as the reason
MISSES = [pytest.param(*m, marks=pytest.mark.xfail(strict=True, reason=m[3]), id=m[0]) for m in _MISSES]


@pytest.mark.parametrize("name,path,first_fix,reason", MISSES)
def test_round5_miss(name, path, first_fix, reason):
    _, failure = _inspect(name)
    assert failure.path == path
    d = failure.diagnosis
    assert d is not None and first_fix in ((d.fix.code if d.fix else "") or "")


def test_a_linear_after_the_users_own_transpose_is_not_transposed_back():
    """Round 5 found the first fix x.transpose(1, 2) here: it runs, and mixes channels where the model
    mixes tokens. With the size sitting on the axis the user's transpose just moved, layerlab now says
    it cannot tell which is wrong, and names both options (the layer's size first)."""
    from tests.probe.audit_round5_models import Mixer

    torch.manual_seed(0)
    x = torch.randn(2, 16, 32)
    with pytest.raises(RuntimeError):
        Mixer()(x)
    assert Mixer(fixed=True)(x).shape == (2, 16, 32)  # the right model: tokens mixed by Linear(16, 16)
    failure = layerlab.inspect(Mixer(), x, backward=False).failure
    d = failure.diagnosis
    assert failure.path == "token_mix" and d.cause == "ambiguous" and d.fix is None
    assert "in_features=16" in d.hint and "transpose" in d.message


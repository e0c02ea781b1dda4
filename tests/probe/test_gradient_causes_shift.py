"""A bias whose gradient is zero because what follows is shift-invariant along the positions it is
added to (softmax over attention-pooling scores; a key projection used through a functional
attention): a note by that mechanism, checked against torch (shifting the bias leaves the output
unchanged), and a near miss that stays a warning."""

import torch
import torch.nn as nn

import layerlab


class AttentionPool(nn.Module):
    """A correct attention-pooling classifier: ``score = Linear(d, 1)``, softmax over the instances."""

    def __init__(self, d=16, classes=3, softmax=True):
        super().__init__()
        self.enc, self.score, self.head = nn.Linear(8, d), nn.Linear(d, 1), nn.Linear(d, classes)
        self.softmax = softmax

    def forward(self, x):  # (B, N, 8)
        h = torch.tanh(self.enc(x))
        s = self.score(h).squeeze(-1)
        w = torch.softmax(s, dim=1) if self.softmax else torch.sigmoid(s)
        return self.head((w.unsqueeze(-1) * h).sum(1))


def _x():
    return torch.randn(4, 10, 8, generator=torch.Generator().manual_seed(1))


def test_attention_pooling_score_bias_is_a_note_not_a_warning():
    torch.manual_seed(0)
    model, x = AttentionPool(), _x()
    report = layerlab.inspect(model, x)
    assert report.warnings == [] and report.ok, report.problems
    (note,) = [n for n in report.notes if n.code == "expected-grad:shift-invariant-bias"]
    assert note.severity == "info" and note.data["params"] == ["score.bias"]
    assert "softmax is shift-invariant" in note.message
    assert "zero by construction" in report.param("score.bias").expected
    # torch agrees: a shift of the score bias changes nothing, a shift of the score weight does
    with torch.no_grad():
        before = model(x)
        model.score.bias.add_(7.0)
        assert (model(x) - before).abs().max() < 1e-5
        model.score.weight.add_(0.5)
        assert (model(x) - before).abs().max() > 1e-3


def test_a_sigmoid_gate_score_bias_is_not_excused():
    """Near miss: the same layer with a sigmoid gate instead of a softmax: its bias matters, its
    gradient does not cancel, and no note claims it does."""
    torch.manual_seed(0)
    model = AttentionPool(softmax=False)
    report = layerlab.inspect(model, _x())
    assert not [n for n in report.notes if n.code == "expected-grad:shift-invariant-bias"]
    assert report.param("score.bias").expected is None
    assert report.param("score.bias").grad_norm > 1e-4


def test_a_tiny_score_bias_gradient_that_does_not_cancel_stays_a_warning():
    """Near miss: every gradient into the scorer is scaled by 1e-9 (a sigmoid gate times 1e-9): the
    bias gradient is tiny because the signal is, not because it cancels — still a warning."""

    class Tiny(AttentionPool):
        def forward(self, x):
            h = torch.tanh(self.enc(x))
            w = torch.sigmoid(self.score(h).squeeze(-1)) * 1e-9
            return self.head((w.unsqueeze(-1) * h).sum(1) + h.mean(1))

    torch.manual_seed(0)
    report = layerlab.inspect(Tiny(softmax=False), _x())
    assert report.param("score.bias").expected is None
    assert any(p.code == "vanishing" and p.where == "score.bias" for p in report.problems)


def test_train_check_on_attention_pooling_has_no_warning():
    torch.manual_seed(0)
    model, x = AttentionPool(), _x()
    report = layerlab.train_check(model, x, target=torch.tensor([0, 1, 2, 1]), loss="cross_entropy", steps=30)
    assert [f for f in report.flags if f.severity != "info"] == [], report.flags

"""The batch axis used as if it were a per-sample axis: softmax or reduction over it, a constant
index on it, broadcasting that pairs it with another axis. Each buggy model has a correct twin
(and the by-design look-alikes: contrastive (B, B) logits, an explicit pairwise difference, a
hand-written batch norm) that must stay silent."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.engine.silent_helpers import at, line_of, silent


class SoftmaxPooling(nn.Module):
    """Attention pooling over time: the scores' softmax must run over T, not over the batch."""

    def __init__(self, fixed: bool = False) -> None:
        super().__init__()
        self.fixed = fixed
        self.score, self.head = nn.Linear(16, 1), nn.Linear(16, 4)

    def forward(self, x):  # (B, T, C)
        scores = self.score(x).squeeze(-1)  # (B, T)
        w = scores.softmax(dim=1 if self.fixed else 0)  # weights
        return self.head((w.unsqueeze(-1) * x).sum(1))


def test_softmax_over_the_batch_is_found():
    found = silent(SoftmaxPooling(), torch.randn(3, 5, 16))
    f = at(found, "silent/batch-normalization", line_of(SoftmaxPooling, "# weights"))
    assert f is not None, found
    assert f.data["op"] == "softmax" and "dim=-1" in f.hint
    assert "(batch)" in f.data["evidence"][0]


def test_softmax_over_time_is_not():
    assert silent(SoftmaxPooling(fixed=True), torch.randn(3, 5, 16)) == []


class Contrastive(nn.Module):
    """CLIP-style logits: (B, B) from a product; the softmax over its second axis is by design."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(8, 16)

    def forward(self, x, y):
        za, zb = F.normalize(self.a(x), dim=-1), F.normalize(self.b(y), dim=-1)
        logits = za @ zb.t()
        return logits.log_softmax(dim=1).diagonal().mean() + logits.log_softmax(dim=0).diagonal().mean()


def test_contrastive_logits_over_the_batch_are_by_design():
    assert silent(Contrastive(), torch.randn(4, 8), torch.randn(4, 8)) == []


class MeanPool(nn.Module):
    """Mean over time before the classifier: mean(0) averages the batch away."""

    def __init__(self, fixed: bool = False) -> None:
        super().__init__()
        self.fixed = fixed
        self.emb, self.head = nn.Embedding(50, 16), nn.Linear(16, 3)

    def forward(self, ids):
        h = self.emb(ids)
        pooled = h.mean(1) if self.fixed else h.mean(0)  # pool
        return self.head(pooled)


def test_mean_over_the_batch_is_found():
    found = silent(MeanPool(), torch.randint(0, 50, (4, 9)))
    f = at(found, "silent/batch-reduction", line_of(MeanPool, "# pool"))
    assert f is not None, found
    assert f.data["op"] == "mean" and "dim=1" in f.hint


def test_mean_over_time_is_not():
    assert silent(MeanPool(fixed=True), torch.randint(0, 50, (4, 9))) == []


class HandBatchNorm(nn.Module):
    """A batch norm written by hand: its statistics over the batch are by design."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        mean, var = h.mean(0, keepdim=True), h.var(0, keepdim=True)
        return (h - mean) / (var + 1e-5).sqrt()


def test_hand_written_batch_norm_is_by_design():
    assert silent(HandBatchNorm(), torch.randn(6, 8)) == []


class LastStep(nn.Module):
    """A batch_first GRU: ``out[-1]`` is the last sample, ``out[:, -1]`` the last step."""

    def __init__(self, fixed: bool = False) -> None:
        super().__init__()
        self.fixed = fixed
        self.gru, self.head = nn.GRU(8, 16, batch_first=True), nn.Linear(16, 2)

    def forward(self, x):
        out, _ = self.gru(x)
        last = out[:, -1] if self.fixed else out[-1]  # last step
        return self.head(last)


def test_constant_index_on_the_batch_axis_is_found():
    found = silent(LastStep(), torch.randn(3, 7, 8))
    f = at(found, "silent/batch-index", line_of(LastStep, "# last step"))
    assert f is not None, found
    assert f.data["op"] == "__getitem__" and "[:, -1]" in f.hint


def test_index_on_the_time_axis_is_not():
    assert silent(LastStep(fixed=True), torch.randn(3, 7, 8)) == []


class SeqFirstLastStep(nn.Module):
    """A seq-first GRU: ``out[-1]`` is the last step, as it should be."""

    def __init__(self) -> None:
        super().__init__()
        self.gru, self.head = nn.GRU(8, 16), nn.Linear(16, 2)

    def forward(self, x):
        out, _ = self.gru(x)
        return self.head(out[-1])


def test_last_step_of_a_seq_first_gru_is_not_a_batch_index():
    assert silent(SeqFirstLastStep(), torch.randn(7, 3, 8)) == []


class Regression(nn.Module):
    """A regression head gives (B, 1); the target is (B,): ``pred - y`` is (B, B)."""

    def __init__(self, fixed: bool = False, functional: bool = False) -> None:
        super().__init__()
        self.fixed, self.functional = fixed, functional
        self.net = nn.Linear(6, 1)

    def forward(self, x, y):
        pred = self.net(x)
        if self.fixed:
            pred = pred.squeeze(-1)
        if self.functional:
            return F.mse_loss(pred, y)  # mse
        return ((pred - y) ** 2).mean()  # residual


def test_prediction_minus_target_broadcast_to_batch_by_batch_is_found():
    found = silent(Regression(), torch.randn(5, 6), torch.randn(5))
    f = at(found, "silent/batch-broadcast", line_of(Regression, "# residual"))
    assert f is not None, found
    assert "squeeze" in f.hint


def test_mse_loss_given_b1_and_b_is_found():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about the broadcast too; the finding says why
        found = silent(Regression(functional=True), torch.randn(5, 6), torch.randn(5))
    assert at(found, "silent/batch-broadcast", line_of(Regression, "# mse")) is not None, found


def test_squeezed_prediction_is_not():
    assert silent(Regression(fixed=True), torch.randn(5, 6), torch.randn(5)) == []
    assert silent(Regression(fixed=True, functional=True), torch.randn(5, 6), torch.randn(5)) == []


class PairwiseRanking(nn.Module):
    """A pairwise ranking loss: ``s[:, None] - s`` pairs every sample with every other on purpose."""

    def __init__(self) -> None:
        super().__init__()
        self.score = nn.Linear(6, 1)

    def forward(self, x):
        s = self.score(x).squeeze(-1)
        return F.softplus(s[:, None] - s).mean()


def test_explicit_pairwise_difference_is_by_design():
    assert silent(PairwiseRanking(), torch.randn(5, 6)) == []


class SetAttention(nn.Module):
    """Attention across the samples of a batch on purpose (a set model): the (B, B) scores have
    two batch axes, and the softmax over the second one is by design."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):  # (B, 8)
        scores = self.q(x) @ self.k(x).t() / 8 ** 0.5
        return scores.softmax(dim=-1) @ self.v(x)


def test_attention_across_the_batch_on_purpose_is_not_found():
    assert silent(SetAttention(), torch.randn(6, 8)) == []


def test_a_frozen_encoder_in_eval_mode_keeps_torchs_fused_path_and_is_not_watched():
    """With the mode on, torch would skip its fused inference path: the run must be as without layerlab."""
    from layerlab.engine.silent_check import watch

    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval()
    with torch.no_grad():
        assert watch(layer, (torch.randn(2, 5, 16),), {}) is None
    assert watch(layer, (torch.randn(2, 5, 16),), {}) is not None  # with gradients: the ordinary path

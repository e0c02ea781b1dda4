"""silent/layer-across-axis and silent/coincident-sizes: code that only runs because two sizes are
equal. A layer sized for the features applied across a time axis of the same length; two different
axes paired by an op. Each has a correct twin, and the by-design look-alike (token mixing across
an axis the model's own transpose moved there) stays silent."""

import torch
import torch.nn as nn

from tests.engine.silent_helpers import at, line_of, silent


class EmbeddingBatchNorm(nn.Module):
    """BatchNorm1d(16) over an Embedding's (B, T=16, C=16): it normalises the time axis."""

    def __init__(self, fixed: bool = False) -> None:
        super().__init__()
        self.fixed = fixed
        self.emb, self.bn, self.head = nn.Embedding(40, 16), nn.BatchNorm1d(16), nn.Linear(16, 2)

    def forward(self, ids):
        h = self.emb(ids)
        if self.fixed:
            h = self.bn(h.transpose(1, 2)).transpose(1, 2)
        else:
            h = self.bn(h)  # norm
        return self.head(h.mean(1))


def test_batchnorm_across_time_of_equal_length_is_found():
    found = silent(EmbeddingBatchNorm(), torch.randint(0, 40, (4, 16)))
    f = at(found, "silent/layer-across-axis", line_of(EmbeddingBatchNorm, "# norm"))
    assert f is not None, found
    assert f.data["module"] == "bn" and f.data["op"] == "F.batch_norm"
    assert "transpose(1, 2)" in f.hint
    assert "(seq)" in f.data["evidence"][0]


def test_batchnorm_over_the_features_is_not():
    assert silent(EmbeddingBatchNorm(fixed=True), torch.randint(0, 40, (4, 16))) == []


class ConvThenLinear(nn.Module):
    """Conv1d gives (B, C=12, L=12); a Linear(12) on it maps over L, not over the channels."""

    def __init__(self, fixed: bool = False) -> None:
        super().__init__()
        self.fixed = fixed
        self.conv, self.fc = nn.Conv1d(4, 12, 3, padding=1), nn.Linear(12, 5)

    def forward(self, x):
        h = self.conv(x)
        if self.fixed:
            h = h.transpose(1, 2)
        return self.fc(h)  # per step


def test_linear_over_the_length_because_it_equals_the_channels_is_found():
    found = silent(ConvThenLinear(), torch.randn(2, 4, 12))
    f = at(found, "silent/layer-across-axis", line_of(ConvThenLinear, "# per step"))
    assert f is not None, found
    assert f.data["module"] == "fc" and "transpose(-2, -1)" in f.hint


def test_linear_over_the_channels_is_not():
    assert silent(ConvThenLinear(fixed=True), torch.randn(2, 4, 12)) == []


class TokenMixing(nn.Module):
    """MLP-Mixer: the token-mixing Linear maps over the patches, moved last by the model's own
    transpose; here the patch count equals the channels, and it is still by design."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.channels = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):  # (B, P=16, C=16)
        x = x + self.tokens(x.transpose(1, 2)).transpose(1, 2)
        return x + self.channels(x)


def test_token_mixing_after_the_models_own_transpose_is_by_design():
    assert silent(TokenMixing(), torch.randn(2, 16, 16)) == []


class ScoresWithoutTranspose(nn.Module):
    """``q @ k`` where ``q @ k.transpose(1, 2)`` was meant: runs only because T == head size."""

    def __init__(self, fixed: bool = False) -> None:
        super().__init__()
        self.fixed = fixed
        self.q, self.k, self.v = nn.Linear(10, 8), nn.Linear(10, 8), nn.Linear(10, 8)

    def forward(self, x):  # (B, T=8, 10)
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = q @ (k.transpose(1, 2) if self.fixed else k)  # scores
        return scores.softmax(-1) @ v


def test_product_that_pairs_features_with_time_is_a_confirmed_coincidence():
    found = silent(ScoresWithoutTranspose(), torch.randn(3, 8, 10))
    f = at(found, "silent/coincident-sizes", line_of(ScoresWithoutTranspose, "# scores"))
    assert f is not None, found
    assert any(e.startswith("confirmed: with distinct sizes") for e in f.data["evidence"])


def test_product_with_the_transpose_is_not():
    assert silent(ScoresWithoutTranspose(fixed=True), torch.randn(3, 8, 10)) == []


class MixedLayouts(nn.Module):
    """A seq-first GRU's output added to a batch-first skip: runs only because B == T."""

    def __init__(self, fixed: bool = False) -> None:
        super().__init__()
        self.fixed = fixed
        self.gru, self.skip = nn.GRU(6, 6), nn.Linear(6, 6)

    def forward(self, x):  # (B, T, 6), batch first
        out, _ = self.gru(x.transpose(0, 1))
        if self.fixed:
            out = out.transpose(0, 1)
        return out + self.skip(x)  # residual


def test_seq_first_plus_batch_first_is_a_confirmed_coincidence():
    found = silent(MixedLayouts(), torch.randn(5, 5, 6))
    f = at(found, "silent/coincident-sizes", line_of(MixedLayouts, "# residual"))
    assert f is not None, found


def test_same_layouts_are_not():
    assert silent(MixedLayouts(fixed=True), torch.randn(5, 5, 6)) == []

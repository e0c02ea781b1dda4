"""silent/interleaving-view: a view/reshape whose split order is not its merge order.

Each buggy model has a correct twin with the same layers; the finding must name the op, its
line and a transpose that keeps the axes whole, and must not fire on the twin.
"""

import torch
import torch.nn as nn

from tests.engine.silent_helpers import at, line_of, silent

RULE = "silent/interleaving-view"


class HeadsMergedWithoutTranspose(nn.Module):
    """(B, H, T, D) → view(B, T, H·D): the heads are merged back without moving T first."""

    def __init__(self, fixed: bool = False) -> None:
        super().__init__()
        self.fixed = fixed
        self.qkv, self.proj, self.heads = nn.Linear(32, 96), nn.Linear(32, 32), 4

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = (q @ k.transpose(-2, -1) / 8 ** 0.5).softmax(-1) @ v
        if self.fixed:
            y = y.transpose(1, 2).reshape(B, T, C)
        else:
            y = y.reshape(B, T, C)  # merge heads
        return self.proj(y)


def test_merging_heads_without_the_transpose_is_an_interleaving_view():
    found = silent(HeadsMergedWithoutTranspose(), torch.randn(2, 6, 32))
    f = at(found, RULE, line_of(HeadsMergedWithoutTranspose, "# merge heads"))
    assert f is not None, found
    assert f.data["op"] == "reshape" and f.severity == "warning"
    assert "transpose(1, 2)" in f.hint
    assert any("x axis 1 (seq)" in e for e in f.data["evidence"])


def test_merging_heads_after_the_transpose_is_not():
    assert silent(HeadsMergedWithoutTranspose(fixed=True), torch.randn(2, 6, 32)) == []


class SeqFirstByReshape(nn.Module):
    """(B, T, C) → reshape(T, B, C) for a seq-first GRU: only a transpose keeps the samples apart.
    With B == T the shapes are identical, so only the distinct-size re-run can tell."""

    def __init__(self, fixed: bool = False) -> None:
        super().__init__()
        self.fixed = fixed
        self.inp, self.gru, self.head = nn.Linear(8, 16), nn.GRU(16, 16), nn.Linear(16, 3)

    def forward(self, x):
        B, T, _ = x.shape
        h = self.inp(x)
        h = h.transpose(0, 1) if self.fixed else h.reshape(T, B, -1)  # to seq-first
        out, _ = self.gru(h)
        return self.head(out[-1])


def test_reshape_to_seq_first_is_found_when_batch_and_time_differ():
    found = silent(SeqFirstByReshape(), torch.randn(3, 5, 8))
    f = at(found, RULE, line_of(SeqFirstByReshape, "# to seq-first"))
    assert f is not None, found
    assert "transpose(0, 1)" in f.hint


def test_reshape_to_seq_first_is_found_when_batch_equals_time():
    """B == T == 4: (4, 4, 16) → (4, 4, 16) regroups nothing at these sizes; with distinct sizes it does."""
    found = silent(SeqFirstByReshape(), torch.randn(4, 4, 8))
    assert at(found, RULE, line_of(SeqFirstByReshape, "# to seq-first")) is not None, found


def test_transpose_to_seq_first_is_not_found():
    assert silent(SeqFirstByReshape(fixed=True), torch.randn(4, 4, 8)) == []
    assert silent(SeqFirstByReshape(fixed=True), torch.randn(3, 5, 8)) == []


class TokensFromMap(nn.Module):
    """(B, C, H, W) → view(B, H·W, C) for a transformer: needs flatten(2).transpose(1, 2)."""

    def __init__(self, fixed: bool = False) -> None:
        super().__init__()
        self.fixed = fixed
        self.conv, self.norm = nn.Conv2d(3, 16, 3, padding=1), nn.LayerNorm(16)

    def forward(self, x):
        f = self.conv(x)
        B, C, H, W = f.shape
        tokens = f.flatten(2).transpose(1, 2) if self.fixed else f.view(B, H * W, C)  # tokens
        return self.norm(tokens)


def test_channels_first_map_viewed_as_tokens_is_an_interleaving_view():
    found = silent(TokensFromMap(), torch.randn(2, 3, 5, 6))
    f = at(found, RULE, line_of(TokensFromMap, "# tokens"))
    assert f is not None, found
    assert f.data["op"] == "view"


def test_flatten_then_transpose_to_tokens_is_not():
    assert silent(TokensFromMap(fixed=True), torch.randn(2, 3, 5, 6)) == []


class WindowPartition(nn.Module):
    """Swin's window partition and reverse: splits and merges of pieces of H and W, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        B, H, W, C = x.shape
        w = x.view(B, H // 2, 2, W // 2, 2, C).permute(0, 1, 3, 2, 4, 5).reshape(-1, 2, 2, C)
        w = self.lin(w)
        w = w.view(B, H // 2, W // 2, 2, 2, C).permute(0, 1, 3, 2, 4, 5).reshape(B, H, W, C)
        return w


def test_window_partition_and_reverse_are_not_interleaving():
    assert silent(WindowPartition(), torch.randn(2, 4, 6, 8)) == []


def test_reshape_to_seq_first_is_found_when_the_time_is_a_multiple_of_the_batch():
    """B = 2, T = 4: (2, 4) → (4, 2) is a clean cut at these sizes; distinct sizes make it unclean."""
    found = silent(SeqFirstByReshape(), torch.randn(2, 4, 8))
    assert at(found, RULE, line_of(SeqFirstByReshape, "# to seq-first")) is not None, found


class Unfold(nn.Module):
    """MobileViT's unfolding: (B, C, H, W) → (B·C·H/p, p, W/p, p), a split of H whose outer piece
    joins the batch and channels: a clean cut, by design."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 1)

    def forward(self, x):
        f = self.conv(x)
        B, C, H, W = f.shape
        p = 2
        patches = f.reshape(B * C * H // p, p, W // p, p).transpose(1, 2)
        patches = patches.reshape(B, C, H * W // (p * p), p * p).transpose(1, 3)
        return patches.reshape(B * p * p, H * W // (p * p), -1)


def test_mobilevit_style_unfolding_is_not_interleaving():
    assert silent(Unfold(), torch.randn(2, 3, 4, 4)) == []
    assert silent(Unfold(), torch.randn(2, 3, 8, 6)) == []

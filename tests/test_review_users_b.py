"""A new user's review of gradcheck, ddp-check and explain-shape: wrong hints and numbers found by
trying them on hand-written layers, each checked against plain torch."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import layerlab
from tests.distributed import planted as P


class RMSNorm(nn.Module):
    """A student's RMSNorm with Llama's eps (1e-5); torch.nn.RMSNorm(dim) defaults to finfo.eps."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _fix(result, check: str) -> str:
    return result.check(check).hint or ""


def test_another_eps_is_a_per_row_statistic_not_a_missing_scale():
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    ref = nn.RMSNorm(16)  # eps=None: torch.finfo(x.dtype).eps
    with torch.no_grad():  # the truth: per-row ratios all differ, each within 1e-5 of 1
        ratio = RMSNorm(16)(x.double()) / F.rms_norm(x.double(), (16,))
    per_row = ratio[:, 0]
    assert torch.allclose(ratio, per_row[:, None].expand_as(ratio), rtol=1e-12, atol=0)
    assert float(per_row.max() - per_row.min()) > 1e-7 and float((per_row - 1).abs().max()) < 1e-4
    r = layerlab.verify(RMSNorm(16), x, reference=ref)
    assert r.check("forward_parity").status == "fail"
    hint = _fix(r, "forward_parity")
    assert "per-row statistic" in hint and "eps" in hint, hint
    assert "a scale is missing" not in hint, hint


def test_one_row_off_by_a_factor_near_one_names_a_small_constant():
    x = torch.randn(1, 16, generator=torch.Generator().manual_seed(1))
    r = layerlab.verify(RMSNorm(16), x, reference=nn.RMSNorm(16))
    hint = _fix(r, "forward_parity")
    assert "within 0.1% of 1" in hint and "eps" in hint, hint


def test_unbiased_variance_ratio_is_still_named():
    class LayerNorm(nn.Module):  # x.var() is unbiased: ratio √((N−1)/N) everywhere
        def __init__(self, n):
            super().__init__()
            self.normalized_shape, self.eps = (n,), 1e-5
            self.weight, self.bias = nn.Parameter(torch.ones(n)), nn.Parameter(torch.zeros(n))

        def forward(self, x):
            return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + self.eps) * self.weight \
                + self.bias

    x = torch.randn(4, 5, 16, generator=torch.Generator().manual_seed(2))
    r = layerlab.verify(LayerNorm(16), x, reference=nn.LayerNorm(16))
    assert "unbiased variance" in _fix(r, "forward_parity")


class CausalAttention(nn.Module):
    """nanoGPT's attention, with the scores divided by d_head instead of √d_head (the bug)."""

    def __init__(self, scale_bug: bool) -> None:
        super().__init__()
        self.c_attn, self.c_proj, self.scale_bug = nn.Linear(32, 96), nn.Linear(32, 32), scale_bug

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, 4, 8).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        if self.scale_bug:
            att = (q @ k.transpose(-2, -1) / 8).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
            y = att.softmax(-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


def test_localised_difference_names_its_indices_in_the_fix():
    torch.manual_seed(0)
    ours, ref = CausalAttention(True), CausalAttention(False)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():  # the truth: position 0 attends to itself only, so any scale gives the same
        same = (ours(x) - ref(x)).abs().amax(dim=(0, 2)) < 1e-6
    assert same.tolist() == [True] + [False] * 5
    r = layerlab.verify(ours, x, reference=ref)
    hint = _fix(r, "forward_parity")
    assert "indices 1–5 of 6 along dim 1" in hint, hint


def test_unused_parameter_row_shows_the_parameter_shape():
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(4))
    model = P.UnusedBranch()
    r = layerlab.ddp_check(model, x, nproc=2, timeout=20)
    assert r.param("aux.weight").unused_on == [0, 1]
    assert r.param("aux.weight").shape == list(model.aux.weight.shape) == [8, 16]
    assert r.param("aux.bias").shape == [8]
    # one process gives it no gradient at all: its scale is unknown ("—"), not 0
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()
    assert model.aux.weight.grad is None and r.param("aux.weight").single_scale is None
    assert r.param("body.weight").single_scale > 0


def test_ceil_extra_window_note_counts_windows_as_torch_does():
    y = F.max_pool2d(torch.zeros(1, 1, 31, 31), 2, 2, ceil_mode=True)
    floor = F.max_pool2d(torch.zeros(1, 1, 31, 31), 2, 2)
    ex = layerlab.explain_shape("max_pool2d", (1, 1, 31, 31), kernel_size=2, stride=2, ceil_mode=True)
    assert ex.output_shape == tuple(y.shape)
    note = next(n for n in ex.notes if n.code == "ceil-extra-window")
    assert f"index {y.shape[-1] - 1}: {y.shape[-1]} windows, floor mode gives {floor.shape[-1]}" in note.message

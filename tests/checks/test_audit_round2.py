"""Audit round 2: custom layers written the way users write them, each with one planted bug, and healthy
ones (their correct versions, stock torch.nn modules, Hugging Face layers from tiny configs).

Every bug must fail the check that tests it, with the explanation that names it; every healthy layer
must get no failure. The planted layers were written independently of layerlab's own planted bugs
(tests/checks/planted_bugs.py).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import layerlab
from layerlab.checks.report import Status


def verdicts(report):
    return {c.name: c for c in report.checks}


def failed(report):
    return sorted(c.name for c in report.checks if c.status == Status.FAIL)


# -- custom autograd.Functions ---------------------------------------------------------------------------

class _Scale2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return 2 * x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, (g * x).sum(0)  # BUG: the factor 2 is dropped


class ScaleLayer(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.w = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        return _Scale2.apply(x, self.w)


class _MatmulT(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, W):
        ctx.save_for_backward(x, W)
        return x @ W.t()

    @staticmethod
    def backward(ctx, g):
        x, W = ctx.saved_tensors
        return g @ W, x.t() @ g  # BUG: grad of W is g.t() @ x


class MyProjection(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.W = nn.Parameter(torch.randn(dim, dim) / dim ** 0.5)

    def forward(self, x):
        return _MatmulT.apply(x, self.W)


class _BiasAddMean(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, b):
        return x + b

    @staticmethod
    def backward(ctx, g):
        return g, g.mean(0)  # BUG: the broadcast (batch) dim must be summed


class BiasAddMean(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.b = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        return _BiasAddMean.apply(x, self.b)


class _Gate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * torch.sigmoid(y)

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        s = torch.sigmoid(y)
        return g * x * s * (1 - s), g * s  # BUG: returned in the wrong order


class Gate(nn.Module):
    def forward(self, x, y):
        return _Gate.apply(x, y)


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, W, b, right_index):
        ctx.save_for_backward(x, W)
        ctx.right_index = right_index
        return x @ W.t() + b

    @staticmethod
    def backward(ctx, g):
        x, W = ctx.saved_tensors
        gx = gW = gb = None
        if ctx.needs_input_grad[0]:
            gx = g @ W
        if ctx.needs_input_grad[1 if ctx.right_index else 0]:  # BUG unless right_index: W's grad under x's flag
            gW = g.reshape(-1, g.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        if ctx.needs_input_grad[2]:
            gb = g.reshape(-1, g.shape[-1]).sum(0)
        return gx, gW, gb, None


class MyLinearFn(nn.Module):
    def __init__(self, fin=6, fout=4, right_index=False):
        super().__init__()
        self.right_index = right_index
        self.weight = nn.Parameter(torch.randn(fout, fin) / fin ** 0.5)
        self.bias = nn.Parameter(torch.randn(fout))

    def forward(self, x):
        return _LinearFn.apply(x, self.weight, self.bias, self.right_index)


def test_backward_missing_a_factor_fails_gradcheck_with_ratio_half():
    torch.manual_seed(0)
    r = layerlab.verify(ScaleLayer(), torch.randn(4, 8))
    assert failed(r) == ["gradcheck"], layerlab.render(r)
    g = verdicts(r)["gradcheck"]
    assert "ratio analytical/numerical 0.5 " in g.summary and g.where == "x, w"
    assert "analytical/numerical is constant for x (0.5), w (0.5)" in g.summary and "a factor 2 dropped" in g.hint


def test_backward_with_transposed_weight_grad_fails_gradcheck_at_that_weight():
    torch.manual_seed(0)
    r = layerlab.verify(MyProjection(), torch.randn(4, 8))
    g = verdicts(r)["gradcheck"]
    assert failed(r) == ["gradcheck"] and g.where == "W", layerlab.render(r)
    assert "the gradient of W is the right one transposed" in g.summary and "g.T @ x" in g.hint


def test_broadcast_grad_averaged_not_summed_fails_gradcheck_with_ratio_one_over_batch():
    torch.manual_seed(0)
    r = layerlab.verify(BiasAddMean(), torch.randn(4, 8))
    g = verdicts(r)["gradcheck"]
    assert failed(r) == ["gradcheck"] and g.where == "b", layerlab.render(r)
    assert "ratio analytical/numerical 0.25 " in g.summary  # 1/B with B = 4
    assert "a mean over 4 elements where the backward must sum over the broadcast dimension" in g.hint


def test_grads_returned_in_the_wrong_order_fail_gradcheck_for_both_inputs():
    torch.manual_seed(0)
    r = layerlab.verify(Gate(), torch.randn(4, 8), torch.randn(4, 8))
    g = verdicts(r)["gradcheck"]
    assert failed(r) == ["gradcheck"] and g.where == "x, y", layerlab.render(r)
    assert "the gradient returned for x is the one y needs, and vice versa" in g.summary
    assert "wrong order" in g.hint


def test_needs_input_grad_index_wrong_names_the_function_that_returns_none():
    torch.manual_seed(0)
    x = torch.randn(5, 6)  # does not require grad: needs_input_grad[0] is False
    r = layerlab.verify(MyLinearFn(), x)
    p = verdicts(r)["param_grads"]
    assert failed(r) == ["param_grads"] and p.where == "weight", layerlab.render(r)
    assert "custom autograd.Function _LinearFn receives weight but its backward returns None" in p.summary
    assert "needs_input_grad" in p.hint
    healthy = layerlab.verify(MyLinearFn(right_index=True), x)
    assert failed(healthy) == [], layerlab.render(healthy)


# -- norms, attention, cells, convolution ----------------------------------------------------------------

class LayerNorm(nn.Module):
    def __init__(self, normalized_shape, eps=1e-5, axis=-1):
        super().__init__()
        self.normalized_shape, self.eps, self._axis = (normalized_shape,), eps, axis
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))

    def forward(self, x):
        mean = x.mean(self._axis, keepdim=True)
        var = x.var(self._axis, keepdim=True, unbiased=False)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.normalized_shape, self.eps = (dim,), eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        ms = x.var(-1, keepdim=True, unbiased=False)  # BUG: RMSNorm divides by the mean of squares
        return x * torch.rsqrt(ms + self.eps) * self.weight


def test_layernorm_over_the_wrong_axis_fails_parity_and_names_the_axis():
    torch.manual_seed(0)
    x = torch.randn(4, 5, 16)
    r = layerlab.verify(LayerNorm(16, axis=-2), x)
    f = verdicts(r)["forward_parity"]
    assert failed(r) == ["backward_parity", "forward_parity"], layerlab.render(r)
    assert "auto-reference torch.nn.LayerNorm" in f.summary
    assert f.details["pattern"]["kind"] == "normalised_axis"
    assert (f.details["pattern"]["ours_dim"], f.details["pattern"]["reference_dim"]) == (-2, -1)
    assert "reduce over dim -1" in f.hint and "not dim -2" in f.hint
    # the premise, in plain torch: the buggy layer standardises along dim -2, torch's along dim -1
    with torch.no_grad():
        ours, ref = LayerNorm(16, axis=-2)(x), nn.LayerNorm(16)(x)
    assert float(ours.mean(-2).abs().max()) < 1e-5 and float(ref.mean(-1).abs().max()) < 1e-5
    assert float(ours.mean(-1).abs().max()) > 0.01
    healthy = layerlab.verify(LayerNorm(16), torch.randn(4, 5, 16))
    assert failed(healthy) == [] and verdicts(healthy)["forward_parity"].status == Status.PASS


def test_rmsnorm_dividing_by_the_variance_is_a_per_row_scale_against_torch_rmsnorm():
    torch.manual_seed(0)
    x = torch.randn(4, 5, 16)
    r = layerlab.verify(RMSNorm(16), x)
    f = verdicts(r)["forward_parity"]
    assert failed(r) == ["backward_parity", "forward_parity"], layerlab.render(r)
    assert "per-row statistic" in f.hint and "mean of squares vs variance" in f.hint
    # the per-row factor is √((mean x² + eps)/(var x + eps)): computed here from torch's RMSNorm directly
    x64 = x.double()
    ratio = (RMSNorm(16).double()(x64) / nn.RMSNorm(16, eps=1e-6).double()(x64))[..., 0]
    want = ((x64.pow(2).mean(-1) + 1e-6) / (x64.var(-1, unbiased=False) + 1e-6)).sqrt()
    torch.testing.assert_close(ratio, want)
    assert f.details["pattern"]["kind"] == "row_ratio"
    assert f.details["pattern"]["row_ratio_min"] == pytest.approx(float(want.min()), rel=1e-6)
    assert f.details["pattern"]["row_ratio_max"] == pytest.approx(float(want.max()), rel=1e-6)


class CausalSelfAttention(nn.Module):
    def __init__(self, embed_dim=16, num_heads=2, diagonal=1):
        super().__init__()
        self.h, self.diagonal = num_heads, diagonal
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        att = q @ k.transpose(-2, -1) / math.sqrt(C // self.h)
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(self.diagonal), float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, T, C))


class MultiheadAttention(nn.Module):
    """Mirrors nn.MultiheadAttention's parameters; BUG: scores divided by d_head, not √d_head."""

    def __init__(self, embed_dim, num_heads, batch_first=True):
        super().__init__()
        self.embed_dim, self.num_heads, self.batch_first = embed_dim, num_heads, batch_first
        self.head_dim = embed_dim // num_heads
        self.in_proj_weight = nn.Parameter(torch.randn(3 * embed_dim, embed_dim) / embed_dim ** 0.5)
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * embed_dim))
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, query, key, value):
        B, L, E = query.shape
        wq, wk, wv = self.in_proj_weight.chunk(3)
        bq, bk, bv = self.in_proj_bias.chunk(3)
        q, k, v = (F.linear(t, w, b).view(B, -1, self.num_heads, self.head_dim).transpose(1, 2)
                   for t, w, b in ((query, wq, bq), (key, wk, bk), (value, wv, bv)))
        att = (q @ k.transpose(-2, -1) / self.head_dim).softmax(-1)
        return self.out_proj((att @ v).transpose(1, 2).reshape(B, L, E)), att.mean(1)


def test_causal_mask_off_by_one_fails_causality_and_names_the_diagonal():
    torch.manual_seed(0)
    r = layerlab.verify(CausalSelfAttention(diagonal=2), torch.randn(2, 6, 16), tags=["causal"])
    c = verdicts(r)["causality"]
    assert failed(r) == ["causality"] and "sees input position 1" in c.summary, layerlab.render(r)
    assert "diagonal=2" in c.hint
    healthy = layerlab.verify(CausalSelfAttention(), torch.randn(2, 6, 16), tags=["causal"])
    assert failed(healthy) == [] and verdicts(healthy)["causality"].status == Status.PASS


def test_attention_divided_by_d_not_sqrt_d_fails_parity_with_the_scale_named():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    r = layerlab.verify(MultiheadAttention(16, 2), x, x, x)
    f = verdicts(r)["forward_parity"]
    assert "forward_parity" in failed(r) and "1/√d_head scale applied twice" in f.summary, layerlab.render(r)


class BatchStandardize(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return (x - x.mean(0, keepdim=True)) / (x.std(0, keepdim=True) + 1e-5) * self.gamma  # BUG: batch stats


def test_batch_statistics_in_eval_fail_batch_independence():
    torch.manual_seed(0)
    with pytest.warns(UserWarning):  # torch's own: std of one sample (the batch_consistency run)
        r = layerlab.verify(BatchStandardize().eval(), torch.randn(6, 8))
    b = verdicts(r)["batch_independence"]
    assert b.status == Status.FAIL and "sample 0's output depends on sample 1" in b.summary, layerlab.render(r)
    assert "reduces over the batch dimension" in b.hint


class GRUCell(nn.Module):
    def __init__(self, input_size, hidden_size, bias=True, swap=False):
        super().__init__()
        self.input_size, self.hidden_size, self.swap = input_size, hidden_size, swap
        k = 1 / math.sqrt(hidden_size)
        self.weight_ih = nn.Parameter(torch.empty(3 * hidden_size, input_size).uniform_(-k, k))
        self.weight_hh = nn.Parameter(torch.empty(3 * hidden_size, hidden_size).uniform_(-k, k))
        self.bias_ih = nn.Parameter(torch.empty(3 * hidden_size).uniform_(-k, k))
        self.bias_hh = nn.Parameter(torch.empty(3 * hidden_size).uniform_(-k, k))

    def forward(self, x, h):
        gi = F.linear(x, self.weight_ih, self.bias_ih).chunk(3, -1)
        gh = F.linear(h, self.weight_hh, self.bias_hh).chunk(3, -1)
        (i_r, i_z, i_n), (h_r, h_z, h_n) = gi, gh
        if self.swap:  # BUG: reads the blocks as (z, r, n)
            (i_z, i_r, i_n), (h_z, h_r, h_n) = gi, gh
        r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
        n = torch.tanh(i_n + r * h_n)
        return (1 - z) * n + z * h


def test_gru_cell_with_swapped_gates_fails_parity_naming_the_order():
    torch.manual_seed(0)
    r = layerlab.verify(GRUCell(6, 8, swap=True), torch.randn(4, 6), torch.randn(4, 8))
    f = verdicts(r)["forward_parity"]
    assert f.status == Status.FAIL and "(z, r, n), torch stacks (r, z, n)" in f.summary, layerlab.render(r)
    healthy = layerlab.verify(GRUCell(6, 8), torch.randn(4, 6), torch.randn(4, 8))
    assert failed(healthy) == [] and verdicts(healthy)["forward_parity"].status == Status.PASS


class UnfoldConv2d(nn.Module):
    """Conv2d by unfold; with ``shift`` (the BUG) it pads (p+1, p−1) on each spatial dim, moving the image."""

    def __init__(self, cin, cout, k, padding, padding_mode=None, shift=True, pad_mode="constant"):
        super().__init__()
        self.in_channels, self.out_channels = cin, cout
        self.kernel_size, self.padding = (k, k), (padding, padding)
        self.stride, self.dilation, self.groups = (1, 1), (1, 1), 1
        self.shift, self.pad_mode = shift, pad_mode
        if padding_mode is not None:
            self.padding_mode = padding_mode
        self.weight = nn.Parameter(torch.randn(cout, cin, k, k) * 0.2)
        self.bias = nn.Parameter(torch.randn(cout) * 0.1)

    def forward(self, x):
        B, _, H, W = x.shape
        p, k, s = self.padding[0], self.kernel_size[0], int(self.shift)
        cols = F.unfold(F.pad(x, (p + s, p - s, p + s, p - s), mode=self.pad_mode), k)
        out = self.weight.view(self.out_channels, -1) @ cols + self.bias[:, None]
        return out.view(B, self.out_channels, H + 2 * p - k + 1, W + 2 * p - k + 1)


UnfoldConv2d.__name__ = "Conv2d"  # named as users name it: the auto-reference looks for torch.nn's name


def test_unfold_conv_shifted_by_padding_fails_parity_when_it_says_its_padding_mode():
    torch.manual_seed(0)
    r = layerlab.verify(UnfoldConv2d(2, 3, 3, 1, padding_mode="zeros"), torch.randn(2, 2, 6, 6))
    f = verdicts(r)["forward_parity"]
    assert f.status == Status.FAIL and "padding applied on one side" in f.hint, layerlab.render(r)
    assert f.details["pattern"]["shift"] == [1, 1]


def test_unfold_conv_without_padding_mode_warns_when_no_torch_padding_mode_matches():
    torch.manual_seed(0)
    r = layerlab.verify(UnfoldConv2d(2, 3, 3, 1), torch.randn(2, 2, 6, 6))
    f = verdicts(r)["forward_parity"]
    assert failed(r) == [] and f.status == Status.WARN, layerlab.render(r)  # a guess is no verdict
    assert "equals it under none of torch's padding modes" in f.summary
    assert "shifted (dim 2 by +1, dim 3 by +1)" in f.summary


@pytest.mark.parametrize("pad_mode,torch_mode", [("constant", "zeros"), ("reflect", "reflect"),
                                                 ("circular", "circular")])
def test_correct_unfold_conv_without_padding_mode_is_compared_under_the_mode_it_equals(pad_mode, torch_mode):
    torch.manual_seed(0)
    x = torch.randn(2, 2, 6, 6)
    m = UnfoldConv2d(2, 3, 3, 1, shift=False, pad_mode=pad_mode)
    # torch agrees the layer is that conv
    ref = nn.Conv2d(2, 3, 3, padding=1, padding_mode=torch_mode)
    with torch.no_grad():
        ref.weight.copy_(m.weight)
        ref.bias.copy_(m.bias)
        torch.testing.assert_close(m(x), ref(x))
    r = layerlab.verify(m, x)
    assert failed(r) == [] and verdicts(r)["forward_parity"].status == Status.PASS, layerlab.render(r)
    assert f"padding_mode={torch_mode!r}" in verdicts(r)["forward_parity"].details["reference"]


# -- dropout, in-place ops, randomness -------------------------------------------------------------------

class Dropout(nn.Module):
    def __init__(self, p=0.5, scaled=False):
        super().__init__()
        self.p, self.scaled = p, scaled

    def forward(self, x):
        if not self.training:
            return x
        out = x * torch.bernoulli(torch.full_like(x, 1 - self.p))
        return out / (1 - self.p) if self.scaled else out  # BUG unless scaled


def test_dropout_without_inverse_scale_fails_train_mode_mean_parity():
    torch.manual_seed(0)
    x = torch.randn(4, 64)
    r = layerlab.verify(Dropout(0.5), x, reference=nn.Dropout(0.5), tags=["stochastic"])
    f = verdicts(r)["forward_parity"]
    assert failed(r) == ["forward_parity"], layerlab.render(r)
    assert "equal in eval mode, but train-mode outputs differ" in f.summary and "1/(1−p)" in f.hint
    assert abs(f.details["train_mean"]["ratio"] - 0.5) < 0.05 and f.details["train_mean"]["dropout_rate"] == 0.5
    healthy = layerlab.verify(Dropout(0.5, scaled=True), x, reference=nn.Dropout(0.5), tags=["stochastic"])
    assert failed(healthy) == [], layerlab.render(healthy)
    assert "in eval mode (train mode draws random numbers" in verdicts(healthy)["forward_parity"].summary


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stock_dropout_layers_keep_mean_parity_with_themselves(seed):
    import copy

    torch.manual_seed(seed)
    for m, x in ((nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True), torch.randn(3, 5, 16)),
                 (nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.3), nn.ReLU()), torch.randn(6, 8)),
                 (nn.Dropout2d(0.3), torch.randn(2, 4, 5, 5))):
        r = layerlab.verify(m, x, reference=copy.deepcopy(m), seed=seed, only=["forward_parity"])
        assert failed(r) == [], layerlab.render(r)


class GatedMLP(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        s = torch.sigmoid(self.fc(x))
        s.mul_(2)  # BUG: sigmoid saved its output for backward
        return s * x


def test_inplace_op_on_a_saved_tensor_is_the_layers_failure_not_torchs_refusal():
    torch.manual_seed(0)
    r = layerlab.verify(GatedMLP(), torch.randn(4, 8))
    g = verdicts(r)["gradcheck"]
    assert g.status == Status.FAIL, layerlab.render(r)
    assert "in-place operation in the forward modified output 0 of Sigmoid" in g.summary
    assert g.where == "forward (output 0 of Sigmoid)" and "out-of-place" in g.hint
    assert not any("says nothing about the layer" in (c.hint or "") for c in r.checks)


def test_inplace_cli_exits_1_with_the_explanation(tmp_path, capsys, monkeypatch):
    from layerlab.cli.app import main

    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("LAYERLAB_DEBUG", raising=False)
    (tmp_path / "mine.py").write_text(
        "import torch, torch.nn as nn\n"
        "class GatedMLP(nn.Module):\n"
        "    def __init__(self, dim=8):\n"
        "        super().__init__(); self.fc = nn.Linear(dim, dim)\n"
        "    def forward(self, x):\n"
        "        s = torch.sigmoid(self.fc(x)); s.mul_(2); return s * x\n")
    (tmp_path / "mine.yaml").write_text("layer: ./mine.py:GatedMLP\ninput: {shape: [4, 8]}\n")
    code = main(["gradcheck", str(tmp_path / "mine.yaml"), "--allow-import"])
    out, err = capsys.readouterr()
    assert code == 1, out + err
    assert "✗ gradcheck  at forward (output 0 of Sigmoid)" in out and "out-of-place form" in " ".join(out.split())
    assert "Traceback" not in out + err
    code = main(["gradcheck", str(tmp_path / "mine.yaml"), "--allow-import", "--json"])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    checks = {c["name"]: c for c in doc["checks"]}
    assert code == 1 and checks["gradcheck"]["status"] == "fail", out + err
    assert "in-place operation in the forward modified output 0 of Sigmoid" in checks["gradcheck"]["summary"]


class NoisyFeature(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return self.fc(x) + 0.01 * torch.randn_like(x)  # BUG: noise in eval too


def test_random_forward_is_one_failure_explained_as_randomness_not_four_wrong_ones():
    torch.manual_seed(0)
    r = layerlab.verify(NoisyFeature().eval(), torch.randn(4, 8))
    v = verdicts(r)
    assert failed(r) == ["gradcheck"], layerlab.render(r)
    assert "the forward is not repeatable" in v["gradcheck"].summary and "randomness" in v["gradcheck"].hint
    assert v["batch_consistency"].status == Status.WARN and "not a verdict" in v["batch_consistency"].summary
    deep = layerlab.verify(NoisyFeature().eval(), torch.randn(4, 8), deep=True,
                           only=["gradcheck", "batch_consistency", "noncontiguous", "determinism"])
    assert failed(deep) == ["determinism"], layerlab.render(deep)
    assert all(verdicts(deep)[n].status == Status.WARN for n in ("gradcheck", "batch_consistency", "noncontiguous"))


# -- healthy: stock torch.nn and Hugging Face layers -----------------------------------------------------

def _causal(n):
    return torch.full((n, n), float("-inf")).triu(1)


@pytest.mark.parametrize("make", [
    lambda: (nn.MultiheadAttention(16, 2, batch_first=True), (torch.randn(2, 5, 16),) * 3, {"attn_mask": _causal(5)}),
    lambda: (nn.GRUCell(6, 8), (torch.randn(4, 6), torch.randn(4, 8)), {}),
    lambda: (nn.GroupNorm(2, 6), (torch.randn(3, 6, 5),), {}),
    lambda: (nn.Conv1d(3, 4, 3, dilation=2, padding=2), (torch.randn(2, 3, 12),), {}),
], ids=["mha_causal", "gru_cell", "group_norm", "conv1d_dilated"])
def test_stock_layers_pass(make):
    torch.manual_seed(0)
    m, args, kwargs = make()
    r = layerlab.verify(m, *args, **kwargs)
    assert failed(r) == [] and not [c for c in r.checks if c.status == Status.WARN], layerlab.render(r)


def test_hf_llama_rmsnorm_passes():
    pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    r = layerlab.verify(LlamaRMSNorm(16), torch.randn(3, 5, 16))
    assert failed(r) == [], layerlab.render(r)


def test_hf_gpt2_attention_alone_is_not_blamed_for_the_mask_its_model_builds():
    transformers = pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    cfg = transformers.GPT2Config(n_embd=16, n_head=2, n_layer=1, n_positions=16, vocab_size=50,
                                  bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    attn = GPT2Attention(cfg, layer_idx=0)
    x = torch.randn(2, 6, 16)
    r = layerlab.verify(attn, x)
    c = verdicts(r)["causality"]
    assert failed(r) == [], layerlab.render(r)
    # what is seen is still said: is_causal=True, yet called alone position 0 reads position 1
    assert c.status == Status.WARN and "called without a mask" in c.summary and "input position 1" in c.summary
    with torch.no_grad():
        y0 = attn(x)[0]
        x2 = x.clone()
        x2[:, 1:] += 1.0
        assert not torch.allclose(attn(x2)[0][:, 0], y0[:, 0])  # torch agrees: it is not causal on its own
    tagged = layerlab.verify(attn, x, tags=["causal"])  # a tag is a promise: then it is a failure
    assert verdicts(tagged)["causality"].status == Status.FAIL

"""Two false FAILs a new-user review found on correct layers, each checked against real torch.

* A hand-written inverted dropout (rate ``self.p``, gated on ``self.training``) is stochastic by
  design: compared with ``nn.Dropout`` by expectation, not called "not repeatable".
* Hugging Face's ``LlamaRMSNorm`` (and a hand-written RMSNorm computing via ``.float()``) rounds
  through float32 inside the float64 parity run: compared at float32 tolerances, with the reason,
  while planted RMSNorm bugs still fail.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerlab
from layerlab.checks.case import Case, is_stochastic
from layerlab.checks.report import CheckResult, Status
from layerlab.checks.repeatable import forward_variation, reexplain
from layerlab.target.bind import Arg


class InvertedDropout(nn.Module):
    def __init__(self, p: float, scaled: bool = True):
        super().__init__()
        self.p, self.scaled = p, scaled

    def forward(self, x):
        if not self.training:
            return x
        mask = (torch.rand_like(x) > self.p).to(x.dtype)
        return x * mask / (1 - self.p) if self.scaled else x * mask


class Dropout(InvertedDropout):
    """Named like torch's, so the auto-reference may pick ``nn.Dropout``."""


class TrainNoise(nn.Module):
    def forward(self, x):
        return x + 0.1 * torch.rand_like(x) if self.training else x


def _failed(report):
    return [(c.name, c.summary, c.hint) for c in report.checks if c.failed]


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_correct_inverted_dropout_passes_against_nn_dropout(p, seed):
    torch.manual_seed(seed)
    x = torch.randn(4, 16)
    layer = InvertedDropout(p)
    # it really is inverted dropout: its train-mode mean over many draws is x, as nn.Dropout's
    mean = torch.stack([layer(x.double()) for _ in range(4000)]).mean(0)
    torch.testing.assert_close(mean, x.double(), atol=6 * (p / (1 - p)) ** 0.5 * float(x.abs().max()) / 4000 ** 0.5,
                               rtol=0)
    report = layerlab.verify(layer, x, reference=nn.Dropout(p), seed=seed)
    assert _failed(report) == []
    fwd = report.check("forward_parity")
    assert fwd.status == Status.PASS and "eval mode" in fwd.summary, fwd.summary


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_correct_inverted_dropout_passes_with_the_auto_reference_or_none(p):
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    for layer in (InvertedDropout(p), Dropout(p)):
        report = layerlab.verify(layer, x)
        assert _failed(report) == [], type(layer).__name__


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_missing_its_scale_still_fails_and_names_p(p):
    torch.manual_seed(0)
    report = layerlab.verify(InvertedDropout(p, scaled=False), torch.randn(4, 16), reference=nn.Dropout(p))
    fwd = report.check("forward_parity")
    assert fwd.status == Status.FAIL, fwd.summary
    assert f"p = {p:g}" in fwd.hint and "1/(1−p)" in fwd.hint
    assert fwd.details["train_mean"]["ratio"] == pytest.approx(1 - p, rel=0.15)  # an estimate over draws


def test_a_dropout_reference_makes_the_layer_stochastic():
    assert not is_stochastic(InvertedDropout(0.5))  # its rate is not named *drop*
    assert is_stochastic(InvertedDropout(0.5), reference=nn.Dropout(0.5))
    assert not is_stochastic(InvertedDropout(0.5), reference=nn.Dropout(0.0))


def test_train_gated_noise_passes_and_the_probe_sees_eval_repeatable():
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    report = layerlab.verify(TrainNoise(), x)
    assert _failed(report) == []
    case = Case(TrainNoise(), [Arg("x", x)], "TrainNoise")
    seen = forward_variation(case)
    assert seen is not None and seen.mode == "train" and seen.eval_repeatable
    # without a re-run, the hint says what it saw, not "gate it on self.training" (it is gated)
    out = reexplain(case, [CheckResult("gradcheck", Status.FAIL, "wrong gradient")])
    assert "gate it on self.training" not in out[0].hint
    assert "eval-mode calls agree" in out[0].summary and "stochastic" in out[0].hint


class UngatedNoise(nn.Module):
    def forward(self, x):
        return x + 0.1 * torch.rand_like(x)


def test_randomness_not_gated_on_training_still_fails():
    report = layerlab.verify(UngatedNoise(), torch.randn(3, 8))
    failed = [c for c in report.checks if c.failed]
    assert failed and "not repeatable" in failed[0].summary and "eval-mode" in failed[0].summary


@pytest.mark.parametrize("layer, shape", [(nn.Dropout(0.3), (4, 16)), (nn.Dropout2d(0.3), (2, 4, 5, 5)),
                                          (nn.AlphaDropout(0.3), (4, 16))])
def test_stock_dropouts_do_not_fail(layer, shape):
    torch.manual_seed(0)
    assert _failed(layerlab.verify(layer, torch.randn(*shape))) == []


# -- float32 islands in parity ----------------------------------------------------------------------

class HandRMSNorm(nn.Module):
    """RMSNorm computing in float32 like Llama's; ``bug`` plants a wrong statistic."""

    def __init__(self, d: int, eps: float = 1e-6, bug: str = "", internal_float: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps, self.bug, self.internal_float = eps, bug, internal_float

    def forward(self, x):
        h = x.float() if self.internal_float else x
        if self.bug == "variance":
            h = h / torch.sqrt(h.var(-1, keepdim=True, unbiased=False) + self.eps)
        elif self.bug == "eps_outside":
            h = h / (torch.sqrt(h.pow(2).mean(-1, keepdim=True)) + self.eps)
        else:
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def _llama_rmsnorm(d):
    pytest.importorskip("transformers", reason="Hugging Face transformers is needed for LlamaRMSNorm")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    return LlamaRMSNorm(d, eps=1e-6)


def _with_weight(layer, seed):
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=torch.Generator().manual_seed(seed + 100)))
    return layer


@pytest.mark.parametrize("shape", [(2, 7, 32), (4, 16), (3, 5, 16)])
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("which", ["llama", "hand"])
def test_float32_rmsnorm_matches_nn_rmsnorm_at_float32_tolerance(shape, seed, which):
    torch.manual_seed(seed)
    x = torch.randn(*shape)
    d = shape[-1]
    layer = _with_weight(_llama_rmsnorm(d) if which == "llama" else HandRMSNorm(d), seed)
    reference = nn.RMSNorm(d, eps=1e-6)
    # correct in fact: equal to torch's RMSNorm to float32 precision
    with torch.no_grad():
        reference.weight.copy_(layer.weight)
        torch.testing.assert_close(layer(x.double()), reference.double()(x.double()), rtol=1.3e-6, atol=1e-5)
    report = layerlab.verify(layer, x, reference=nn.RMSNorm(d, eps=1e-6), only=["forward_parity", "backward_parity"])
    assert _failed(report) == []
    for name in ("forward_parity", "backward_parity"):
        check = report.check(name)
        assert "float32 tolerances" in check.summary and "inside the float64 run" in check.summary, check.summary
        assert check.details["low_precision"]["dtype"] == "float32"


def test_float64_rmsnorm_keeps_float64_tolerance():
    torch.manual_seed(0)
    layer = _with_weight(HandRMSNorm(16, internal_float=False), 0)
    report = layerlab.verify(layer, torch.randn(4, 16), reference=nn.RMSNorm(16, eps=1e-6),
                             only=["forward_parity", "backward_parity"])
    assert _failed(report) == []
    assert all("low_precision" not in report.check(n).details for n in ("forward_parity", "backward_parity"))


@pytest.mark.parametrize("internal_float", [False, True])
@pytest.mark.parametrize("shape", [(2, 7, 32), (4, 16)])
def test_planted_rmsnorm_variance_bug_still_fails(internal_float, shape):
    torch.manual_seed(0)
    layer = HandRMSNorm(shape[-1], bug="variance", internal_float=internal_float)
    report = layerlab.verify(layer, torch.randn(*shape), reference=nn.RMSNorm(shape[-1], eps=1e-6),
                             only=["forward_parity", "backward_parity"])
    fwd = report.check("forward_parity")
    assert fwd.status == Status.FAIL and report.check("backward_parity").status == Status.FAIL
    assert fwd.details["pattern"]["kind"] == "row_ratio"


@pytest.mark.parametrize("internal_float, eps", [(False, 1e-6), (True, 1e-4)])
def test_planted_rmsnorm_eps_outside_sqrt_still_fails(internal_float, eps):
    # with float32 inside, eps = 1e-6 moves the output by ~1e-6 relative: below float32 rounding, so
    # the island-aware comparison cannot see it; eps = 1e-4 is well above it
    torch.manual_seed(0)
    layer = HandRMSNorm(32, eps=eps, bug="eps_outside", internal_float=internal_float)
    report = layerlab.verify(layer, torch.randn(2, 7, 32), reference=nn.RMSNorm(32, eps=eps),
                             only=["forward_parity", "backward_parity"])
    assert report.check("forward_parity").status == Status.FAIL


def test_rounding_noise_is_not_described_as_a_pattern():
    from layerlab.checks.patterns import pattern

    torch.manual_seed(0)
    x = torch.randn(4, 7, 32, dtype=torch.float64)
    exact = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    rounded = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).double()
    assert pattern(rounded, exact, tol=(1.3e-6, 1e-5)) is None
    shifted = rounded.clone()
    shifted[:, :, 3] += 0.01  # a real difference well above the rounding is still located
    found = pattern(shifted, exact, tol=(1.3e-6, 1e-5))
    assert found is not None and found.kind == "indices" and found.details["indices"] == [3]


class _F32RMSNorm(nn.Module):
    """A correct RMSNorm computing in float32 (as Hugging Face's LlamaRMSNorm does)."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class _TwiceBias(nn.Linear):
    def forward(self, x):
        return super().forward(x) + self.bias  # the planted bug: the bias twice


class _NormProj(nn.Module):
    def __init__(self, norm, proj):
        super().__init__()
        self.norm, self.proj = norm, proj

    def forward(self, x):
        return self.proj(self.norm(x))


@pytest.mark.parametrize("seed", range(6))
def test_the_first_divergent_submodule_ignores_float32_rounding_before_the_bug(seed):
    # before: with seed 2 the correct float32 norm was named as where the outputs first diverge
    torch.manual_seed(seed)
    ours = _NormProj(_F32RMSNorm(32), _TwiceBias(32, 8))
    with torch.no_grad():
        ours.norm.weight.normal_(1, 0.5)
    ref = _NormProj(nn.RMSNorm(32, eps=1e-6), nn.Linear(32, 8))
    x = torch.randn(2, 7, 32) * 3
    # the premise: the norm alone agrees with torch's at float32 tolerance (it only rounds); on copies
    # in float64, so the models verify takes stay as built
    import copy

    ours64, ref64 = copy.deepcopy(ours.norm).double(), copy.deepcopy(ref.norm).double()
    ref64.weight.data.copy_(ours64.weight.data)
    with torch.no_grad():
        torch.testing.assert_close(ours64(x.double()), ref64(x.double()), rtol=1.3e-6, atol=1e-5)
    r = layerlab.verify(ours, x, reference=ref)
    f = {c.name: c for c in r.checks}["forward_parity"]
    assert f.status == Status.FAIL and f.where == "proj", (f.where, f.summary)
    assert f.details["divergence"]["where"] == "proj"

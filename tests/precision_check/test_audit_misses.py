"""Three wrong verdicts of precision-check found by an independent audit, each checked against
plain torch first: a hand-written log(sigmoid(z)) whose probability rounds to 0 in float16 (was "I
can't tell which op"); a LayerNorm written without eps on activations of ~1e-4, whose squares are
below float16's smallest normal (was blamed on E[x²] − E[x]² cancellation); and a +1000 offset
added before a LayerNorm in bfloat16 (was blamed on the LayerNorm, whose float32 fix does not help).
Each fix layerlab suggests is applied by hand and checked to remove the problem.
Letters: B batch · E features · L length.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import layerlab
from layerlab.mixed.dtypes import autocast_supported, tolerance

FP16_TINY = torch.finfo(torch.float16).smallest_normal


def _line(text: str) -> str:
    """``test_audit_misses.py:N``: the line of this file that holds ``text``."""
    with open(__file__) as f:
        n = next(i for i, line in enumerate(f, 1) if text in line and "_line(" not in line)
    return f"{os.path.basename(__file__)}:{n}"


def _problems(report):
    return [(f.kind, f.where, f.message) for f in report.findings if f.severity in ("error", "warning")]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b).norm() / b.norm())


# -- B4: log of a probability that rounds to 0 ---------------------------------------------------

class _LogLikelihood(nn.Module):
    """Per-class log-likelihoods of a multi-label classifier with large logits (|z| up to ~50)."""

    def __init__(self, head: str = "sigmoid"):
        super().__init__()
        self.head = head
        self.fc, self.act = nn.Linear(16, 8), nn.Sigmoid()
        with torch.no_grad():
            self.fc.weight.mul_(30.0)

    def forward(self, x):
        z = self.fc(x)
        if self.head == "sigmoid":
            return torch.log(torch.sigmoid(z))  # B4: sigmoid(z) is 0 in float16 for z < -17
        if self.head == "module":
            return torch.log(self.act(z))  # the same with nn.Sigmoid
        if self.head == "logsigmoid":
            return F.logsigmoid(z)  # the fix precision-check suggests
        if self.head == "softmax":
            return torch.log(torch.softmax(z, dim=-1))  # the same with a softmax
        return F.log_softmax(z, dim=-1)


def _b4(head):
    torch.manual_seed(0)
    return _LogLikelihood(head), torch.randn(32, 16)


@pytest.mark.parametrize("head, made_by, code, fixed, fix_text", [
    ("sigmoid", "sigmoid", "return torch.log(torch.sigmoid(z))", "logsigmoid", "F.logsigmoid(z)"),
    ("module", "sigmoid", "return torch.log(self.act(z))", "logsigmoid", "F.logsigmoid(z)"),
    ("softmax", "softmax", "return torch.log(torch.softmax(z, dim=-1))", "log_softmax", "F.log_softmax(x, dim)")])
def test_log_of_a_probability_that_rounds_to_0_names_the_log_and_its_fix(head, made_by, code, fixed, fix_text):
    model, x = _b4(head)
    with torch.no_grad():  # the bug is real: the probability is exactly 0 in float16, log(0) = -inf
        half = copy.deepcopy(model).half()
        z = half.fc(x.half())
        p = torch.sigmoid(z) if made_by == "sigmoid" else torch.softmax(z, dim=-1)
        assert (p == 0).any() and torch.isneginf(torch.log(p)).any()
        assert torch.isfinite(model(x)).all() and not torch.isfinite(half(x.half())).all()
    report = layerlab.precision_check(model, x, autocast=[], cast=["float16"])
    first = report.runs[0].first
    assert not report.ok and first.where == "(root)" and first.kind == "non-finite", _problems(report)
    assert first.cause.startswith("log ") and f"{made_by}'s output" in first.cause, first.cause
    assert "rounded to 0" in first.cause and "-inf" in first.cause
    assert first.source.endswith(_line(code))
    assert fix_text in first.fix, first.fix

    # the suggested fix, applied by hand with the same weights, removes the problem
    repaired = _LogLikelihood(fixed)
    repaired.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.isfinite(copy.deepcopy(repaired).half()(x.half())).all()
        torch.testing.assert_close(repaired(x), model(x))  # the same function in float32
    after = layerlab.precision_check(repaired, x, autocast=[], cast=["float16"])
    assert after.ok and not _problems(after), _problems(after)


@pytest.mark.skipif(autocast_supported("cpu", "float16") is not None, reason="no float16 autocast on this CPU build")
def test_log_of_sigmoid_under_float16_autocast_is_named_too():
    model, x = _b4("sigmoid")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        assert not torch.isfinite(model(x)).all()  # torch's own autocast run has -inf
    first = layerlab.precision_check(model, x, autocast=["float16"]).runs[0].first
    assert first.cause.startswith("log ") and "F.logsigmoid(z)" in first.fix, (first.cause, first.fix)


# -- B5: a LayerNorm without eps on tiny activations -----------------------------------------------

class _HandNorm(nn.Module):
    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def forward(self, x):
        m = x.mean(-1, keepdim=True)
        if self.how == "pow":
            return (x - m) / torch.sqrt(((x - m) ** 2).mean(-1, keepdim=True))  # B5: no eps
        if self.how == "var":
            return (x - m) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False))  # B5 again, no eps
        return (x - m) / torch.sqrt(((x - m) ** 2).mean(-1, keepdim=True) + 1e-5)  # the fix: an eps


class _TinyActivations(nn.Module):
    """Activations of ~1e-4 (a layer initialised 1e-4 times too small) into a hand-written norm."""

    def __init__(self, how: str):
        super().__init__()
        self.a, self.n, self.b = nn.Linear(16, 32), _HandNorm(how), nn.Linear(32, 8)
        with torch.no_grad():
            self.a.weight.mul_(1e-4)
            self.a.bias.mul_(1e-4)

    def forward(self, x):
        return self.b(self.n(self.a(x)))


def _b5(how):
    torch.manual_seed(0)
    return _TinyActivations(how), torch.randn(32, 16)


@pytest.mark.parametrize("how, op, code", [("pow", "pow", "torch.sqrt(((x - m) ** 2).mean(-1, keepdim=True))  #"),
                                           ("var", "var", "torch.sqrt(x.var(-1, keepdim=True, unbiased=False))")])
def test_squares_below_float16s_smallest_normal_are_named_not_called_cancellation(how, op, code):
    model, x = _b5(how)
    with torch.no_grad():  # the truth: every square is below 6.1e-5; in float16 they are (mostly) 0
        h = model.a(x)
        squares = (h - h.mean(-1, keepdim=True)) ** 2
        assert float(squares.max()) < FP16_TINY
        h16 = h.half()
        assert float(((h16 - h16.mean(-1, keepdim=True)) ** 2 == 0).float().mean()) > 0.9
        assert torch.isfinite(model(x)).all() and not torch.isfinite(copy.deepcopy(model).half()(x.half())).all()
    report = layerlab.precision_check(model, x, autocast=[], cast=["float16"])
    first = report.runs[0].first
    assert first.where == "n" and first.kind == "non-finite", _problems(report)
    assert first.cause.startswith(f"{op} runs in float16") and "smallest normal 6.1e-05" in first.cause, first.cause
    assert "cancels" not in first.cause and "not a cancellation" in first.cause
    measured = float(squares.max() if how == "pow" else h.var(-1, unbiased=False).max())
    assert f"at most {measured:.2g} in float32" in first.cause, (measured, first.cause)
    assert first.source.endswith(_line(code)), first.source
    assert first.fix.startswith("add an eps") and "1e-5" in first.fix


def test_a_stock_layernorm_on_tiny_activations_is_no_finding():
    """nn.LayerNorm adds eps = 1e-5 inside the square root: the same tiny activations pass."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 8))
    with torch.no_grad():
        model[0].weight.mul_(1e-4)
        model[0].bias.mul_(1e-4)
    report = layerlab.precision_check(model, torch.randn(32, 16), autocast=[], cast=["float16"])
    assert report.ok and not _problems(report), _problems(report)


def test_the_eps_fix_removes_the_problem():
    broken, x = _b5("pow")
    fixed = _TinyActivations("eps")
    fixed.load_state_dict(broken.state_dict())
    with torch.no_grad():
        assert torch.isfinite(copy.deepcopy(fixed).half()(x.half())).all()
    report = layerlab.precision_check(fixed, x, autocast=[], cast=["float16"])
    assert report.ok and not _problems(report), _problems(report)


class _MeanOfSquares(nn.Module):
    def forward(self, x):
        return x.pow(2).mean(-1, keepdim=True) - x.mean(-1, keepdim=True) ** 2


def test_a_real_cancellation_in_a_hand_written_variance_keeps_its_verdict():
    """Inputs exact in bfloat16 (even integers 256…270): nothing is lost on the way in, the squares
    (~7e4) are far above any smallest normal and rounded to a step of 512: a genuine E[x²] − E[x]²."""
    torch.manual_seed(0)
    x = 256.0 + 2.0 * torch.randint(0, 8, (16, 64)).float()
    assert torch.equal(x.bfloat16().float(), x)  # the input itself is exact
    with torch.no_grad():
        ref = _MeanOfSquares()(x)
        low = _MeanOfSquares()(x.bfloat16())
    assert _rel(low, ref) > 0.5  # the bug is real (float32 gives ~20, bfloat16 mostly rounding)
    first = layerlab.precision_check(_MeanOfSquares(), x, autocast=[], cast=["bfloat16"]).runs[0].first
    assert first.cause.startswith("pow runs in bfloat16") and "E[x²] − E[x]²" in first.cause, first.cause


def test_an_input_rounded_by_the_cast_itself_is_said_to_be_lost_on_the_way_in():
    """Inputs 300 + N(0, 1): casting them to bfloat16 (step 2 at 300) already loses their spread,
    before any op of the model ran; the variance is not the one to blame."""
    torch.manual_seed(0)
    x = torch.randn(16, 64) + 300.0
    centred = x - x.mean()
    lost = x.bfloat16().float() - x.bfloat16().float().mean()
    assert _rel(lost, centred) > 0.3  # the truth: the cast alone loses a third of the spread or more
    first = layerlab.precision_check(_MeanOfSquares(), x, autocast=[], cast=["bfloat16"]).runs[0].first
    assert "the model's input was rounded" in first.cause and first.fix.startswith("subtract the offset"), \
        (first.cause, first.fix)


# -- B7: a large offset added before a LayerNorm ------------------------------------------------

class _OffsetEmbedding(nn.Module):
    def __init__(self, offset: bool = True):
        super().__init__()
        self.offset = offset
        self.emb, self.ln, self.out = nn.Embedding(50, 32), nn.LayerNorm(32), nn.Linear(32, 8)

    def forward(self, ids):
        if self.offset:
            h = self.emb(ids) + 1000.0  # B7: bfloat16's step at 1000 is 4
        else:
            h = self.emb(ids)  # the fix: the LayerNorm subtracts the mean anyway
        return self.out(self.ln(h))


def _b7():
    torch.manual_seed(0)
    return _OffsetEmbedding(), torch.randint(0, 50, (4, 12))


@pytest.mark.parametrize("dtype, step", [("bfloat16", 4.0), ("float16", 0.5)])
def test_a_large_offset_is_blamed_where_it_rounds_the_spread_away(dtype, step):
    model, ids = _b7()
    half, bar = getattr(torch, dtype), tolerance(dtype).output
    assert float(torch.tensor(1000.0, dtype=half).nextafter(torch.tensor(2000.0, dtype=half))) - 1000.0 == step
    with torch.no_grad():  # the truth, in plain torch
        e = model.emb(ids)
        h32, h16 = e + 1000.0, e.to(half) + 1000.0
        if dtype == "bfloat16":
            assert h16[0, 0].unique().numel() <= 2  # 32 distinct values collapse to one or two
        ln32 = model.ln(h32)
        assert _rel(copy.deepcopy(model.ln).to(half)(h16), ln32) > 4 * bar
        assert _rel(model.ln(h16.float()), ln32) > 4 * bar  # the LayerNorm in float32 does not help
        assert _rel(copy.deepcopy(model.ln).to(half)(e.to(half)), ln32) < bar  # removing the offset does
    report = layerlab.precision_check(model, ids, autocast=[], cast=[dtype])
    first = report.runs[0].first
    assert first.where == "(root)" and "ln (LayerNorm)" in first.message, (first.where, first.message)
    assert first.cause.startswith(f"add runs in {dtype}") and f"step there is {step:g}," in first.cause, first.cause
    assert "cannot bring it back" in first.cause
    assert first.source.endswith(_line("h = self.emb(ids) + 1000.0"))
    assert first.fix.startswith("remove the offset"), first.fix


def test_the_offset_fix_brings_the_layernorm_below_the_bar():
    model, ids = _b7()
    fixed = _OffsetEmbedding(offset=False)
    fixed.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(fixed(ids), model(ids), atol=1e-3, rtol=1e-3)  # the same model in float32
    report = layerlab.precision_check(fixed, ids, autocast=[], cast=["bfloat16"])
    run = report.runs[0]
    ln = next(r for r in run.rows if r.path == "ln")
    assert ln.error < tolerance("bfloat16").output, ln.error
    assert report.ok and not _problems(report), _problems(report)


def test_an_offset_under_autocast_is_no_finding():
    """Under bf16 autocast the embedding, the add and the LayerNorm run in float32 (torch's lists):
    nothing is lost, and nothing is said."""
    model, ids = _b7()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert model.ln(model.emb(ids) + 1000.0).dtype == torch.float32
    report = layerlab.precision_check(model, ids, autocast=["bfloat16"])
    assert report.ok and not _problems(report), _problems(report)


def test_a_run_that_raises_names_the_module_it_raised_in():
    # a float32 position table made inside forward meets the float16-cast model: the `where` of the
    # finding was the exception's class ('RuntimeError'); it is the module call that raised
    class Positions(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            pos = torch.arange(x.shape[1], dtype=torch.float32)[None, :, None] * torch.ones(1, 1, 8)
            return self.fc(x + pos)

    torch.manual_seed(0)
    model, x = Positions(), torch.randn(2, 5, 8)
    with pytest.raises(RuntimeError):  # the premise, in plain torch: the cast model raises in fc
        model.half()(x.half())
    model.float()
    report = layerlab.precision_check(model, x, cast=["float16"], autocast=[])
    (raised,) = [f for f in report.findings if f.kind == "raised"]
    assert raised.where == "fc" and raised.severity == "error"

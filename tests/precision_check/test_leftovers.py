"""precision-check's rows and its finding tell one story: the call the finding blames carries
``precision``; a call whose output is off only because its input already was is ``upstream``, never
``precision``. Before, a pre-LN block whose residual add rounded the stream away had its finding
on the add and its ``precision`` flag on the LayerNorm after it (and, two modules up, the finding
itself named the LayerNorm).

The truth per call is measured in plain torch, on each call's float32 input captured by a hook:
its *own* error is the call in low precision against the same call in float32 on the very same
input rounded to the low dtype (so nothing upstream is counted); *upstream* error is that rounding
of the input alone, seen through the call in float32.
Letters: B batch · L length · E features.
"""

from __future__ import annotations

import copy
import os

import torch
from torch import nn

import layerlab
from layerlab.mixed.dtypes import tolerance

BAR = tolerance("bfloat16").output  # 8 ε of bfloat16


def _line(text: str) -> str:
    with open(__file__) as f:
        n = next(i for i, line in enumerate(f, 1) if text in line and "_line(" not in line)
    return f"{os.path.basename(__file__)}:{n}"


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b).norm() / b.norm())


def _input_of(model: nn.Module, module: nn.Module, *x) -> torch.Tensor:
    """The float32 input ``module`` receives in ``model(*x)``."""
    seen = []
    handle = module.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach().clone()))
    try:
        with torch.no_grad():
            model(*x)
    finally:
        handle.remove()
    return seen[0]


def _own_and_upstream(module: nn.Module, x32: torch.Tensor, how: str):
    """``(own, upstream)`` errors of ``module`` at float32 input ``x32`` in bfloat16 (``how``: the run's
    kind, ``autocast`` or ``cast``)."""
    xr = x32.bfloat16()
    with torch.no_grad():
        truth, exact_in = module(x32), module(xr.float())
        if how == "cast":
            half = copy.deepcopy(module).bfloat16()(xr)
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                half = module(xr)
    return _rel(half, exact_in), _rel(exact_in, truth)


def _centred_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float() - a.float().mean(-1, keepdim=True), b - b.mean(-1, keepdim=True)
    return float((a - b).norm() / b.norm())


def _one_story(run):
    """A finding that blames a call has ``precision`` on that call's row; one that says the loss came
    before its call (no op of the code it ran could be named) has ``upstream`` there; never both."""
    for f in run.findings:
        if f.severity == "error" and f.kind == "precision":
            row = next(r for r in run.rows if r.label == f.where)
            want = "upstream" if "lost before it ran" in f.message else "precision"
            assert want in row.flags, (f.where, row.flags, f.message)
    for row in run.rows:
        assert not ({"precision", "upstream"} <= set(row.flags)), (row.label, row.flags)


# -- a stock pre-LN TransformerEncoderLayer ---------------------------------------------------------

def _stock_pre_ln():
    torch.manual_seed(0)
    block = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True, norm_first=True)
    return block, torch.randn(2, 12, 64, generator=torch.Generator().manual_seed(1))


def test_stock_pre_ln_block_under_bf16_autocast_flags_no_row():
    block, x = _stock_pre_ln()
    for name in ("norm1", "norm2", "linear1", "linear2"):  # the truth: no call adds 8 ε of its own
        module = getattr(block, name)
        own, _ = _own_and_upstream(module, _input_of(block, module, x), "autocast")
        assert own < BAR, (name, own)
    report = layerlab.precision_check(block, x)
    run = report.runs[0]
    assert report.ok and [r.flags for r in run.rows if r.flags] == [], [(r.label, r.flags) for r in run.rows]


def test_stock_pre_ln_block_fed_an_uncentred_stream_in_bf16_blames_no_layernorm():
    """The same block fed a residual stream around 500 and cast to bfloat16 (step 2 there): both
    LayerNorms show ~68 ε, yet neither made it — on a bfloat16 input each is within 1 ε of float32;
    the rounding of their input (the cast, torch's own residual add) is all of it."""
    block, x = _stock_pre_ln()
    x = x + 500.0
    for name in ("norm1", "norm2"):
        own, upstream = _own_and_upstream(block.get_submodule(name), _input_of(block, block.get_submodule(name), x),
                                          "cast")
        assert own < BAR / 8 and upstream > 4 * BAR, (name, own, upstream)
    run = layerlab.precision_check(block, x, autocast=[], cast=["bfloat16"]).runs[0]
    for name in ("norm1", "norm2"):
        row = run.row(name)
        assert row.error > 4 * BAR and row.flags == ["upstream"], (name, row.error, row.flags)
        finding = next(f for f in run.findings if f.where == name)
        assert "lost before it ran" in finding.message and "not of its own making" in finding.message
    assert not [r.label for r in run.rows if "precision" in r.flags]
    _one_story(run)


# -- a planted block whose residual add rounds the stream away -----------------------------------------

class _ResidualBlock(nn.Module):
    """Pre-LN: h = x + attn(ln1(x)); out = h + mlp(ln2(h)), fed a stream carrying a large offset."""

    def __init__(self, e: int = 64):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(e), nn.LayerNorm(e)
        self.attn = nn.MultiheadAttention(e, 4, batch_first=True)
        self.fc1, self.fc2 = nn.Linear(e, 4 * e), nn.Linear(4 * e, e)

    def forward(self, x):                                         # x: (B, L, E)
        a = self.ln1(x)
        h = x + self.attn(a, a, a, need_weights=False)[0]         # the planted add: bf16 step 2 at |x| ~ 500
        return h + self.fc2(torch.relu(self.fc1(self.ln2(h))))


def test_a_residual_add_that_rounds_the_stream_is_the_row_flagged():
    torch.manual_seed(0)
    block = _ResidualBlock()
    with torch.no_grad():
        block.attn.out_proj.weight.mul_(8.0)  # an update of std ~1.5: the size of the stream's spread
    # a stream at 512 on bfloat16's grid there (step 4): the cast rounds nothing, the add rounds the update
    x = 512.0 + 4.0 * torch.randint(0, 2, (2, 12, 64), generator=torch.Generator().manual_seed(1)).float()
    x16 = x.bfloat16()
    assert torch.equal(x16.float(), x)
    half = copy.deepcopy(block).bfloat16()
    with torch.no_grad():  # the truth: the add's own rounding loses the spread ...
        a = half.ln1(x16)
        update = half.attn(a, a, a, need_weights=False)[0]
        assert _centred_rel(x16 + update, x16.float() + update.float()) > 4 * BAR
        # ... and ln2 itself adds nothing: on the bf16 h, in bf16 or in float32, it agrees within 1 ε
        h16 = x16 + update
        assert _rel(half.ln2(h16), block.ln2(h16.float())) < BAR / 8
    run = layerlab.precision_check(block, x, autocast=[], cast=["bfloat16"]).runs[0]
    finding = next(f for f in run.findings if "ln2" in f.message)
    assert finding.where == "(root)" and finding.source.endswith(_line("h = x + self.attn(a, a, a")), finding
    assert finding.cause.startswith("add runs in bfloat16"), finding.cause
    assert "precision" in run.row("").flags  # the row of the add's call carries the blame ...
    assert run.row("ln2").flags == ["upstream"]  # ... and ln2 only shows it (it was "precision")
    assert run.row("ln2").error > 4 * BAR and run.row("ln1").flags == []
    _one_story(run)


class _OffsetStack(nn.Module):
    """A projection plus a large constant, two modules above the LayerNorm that shows the loss."""

    def __init__(self, e: int = 64):
        super().__init__()
        self.emb = nn.Linear(e, e)
        self.block = nn.Sequential()
        self.block.ln, self.block.fc = nn.LayerNorm(e), nn.Linear(e, e)

    def forward(self, x):
        h = self.emb(x) + 1000.0  # under bf16 autocast: a bfloat16 add, step 4 at 1000
        return self.block(h)


def test_an_offset_added_two_modules_up_is_found_and_the_layernorm_is_not_blamed():
    torch.manual_seed(0)
    model, x = _OffsetStack(), torch.randn(2, 12, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        h = model.emb(x) + 1000.0
        assert h.dtype == torch.bfloat16  # autocast keeps the add in bfloat16
    own, upstream = _own_and_upstream(model.block.ln, _input_of(model, model.block.ln, x), "autocast")
    assert own < BAR / 8 and upstream > 4 * BAR, (own, upstream)  # the truth: the input, not the norm
    run = layerlab.precision_check(model, x).runs[0]
    first = next(f for f in run.findings if f.severity == "error")
    assert first.where == "(root)" and first.source.endswith(_line("h = self.emb(x) + 1000.0")), first
    assert "block.ln" in first.message and "not of its own making" in first.message
    assert run.row("block.ln").flags == ["upstream"] and "precision" in run.row("").flags
    assert run.row("block").flags == ["upstream"]  # the same loss, seen through the Sequential around it
    _one_story(run)


# -- a LayerNorm that is at fault itself -------------------------------------------------------------

class _HalfVarianceNorm(nn.Module):
    """A LayerNorm written by hand with its variance as E[x²] − E[x]² in the input's dtype."""

    def __init__(self, e: int):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(e)), nn.Parameter(torch.zeros(e))

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = (x * x).mean(-1, keepdim=True) - mean * mean  # the bug: cancels in bfloat16
        return (x - mean) * torch.rsqrt(var + 1e-5) * self.weight + self.bias


class _PreLNWithOwnNorm(nn.Module):
    def __init__(self, e: int = 64, norm=None):
        super().__init__()
        self.inp = nn.Linear(e, e)
        self.ln = norm if norm is not None else _HalfVarianceNorm(e)
        self.fc1, self.fc2 = nn.Linear(e, 2 * e), nn.Linear(2 * e, e)
        with torch.no_grad():
            self.inp.bias.fill_(8.0)  # an un-centred stream: mean 8, spread ~1 (no offset that swamps it)

    def forward(self, x):
        h = self.inp(x)
        return h + self.fc2(torch.relu(self.fc1(self.ln(h))))


def test_a_layernorm_that_loses_precision_itself_keeps_the_flag():
    torch.manual_seed(0)
    model, x = _PreLNWithOwnNorm(), torch.randn(2, 12, 64, generator=torch.Generator().manual_seed(1))
    x_ln = _input_of(model, model.ln, x)
    own, upstream = _own_and_upstream(model.ln, x_ln, "autocast")
    assert own > 4 * BAR and upstream < BAR, (own, upstream)  # the truth: its own computation
    stock = nn.LayerNorm(64)
    assert _own_and_upstream(stock, x_ln, "autocast")[0] < BAR / 8  # torch's LayerNorm on the same input
    run = layerlab.precision_check(model, x).runs[0]
    first = next(f for f in run.findings if f.severity == "error")
    assert first.where == "ln" and first.message.startswith("ln (_HalfVarianceNorm) loses precision"), first.message
    assert "precision" in run.row("ln").flags and "upstream" not in run.row("ln").flags
    assert "inherited" in run.row("").flags  # the model's row only contains the culprit
    _one_story(run)
    # and torch's own LayerNorm in its place (the same weights elsewhere) flags nothing
    fixed = _PreLNWithOwnNorm(norm=nn.LayerNorm(64))
    fixed.load_state_dict(model.state_dict())
    report = layerlab.precision_check(fixed, x)
    assert report.ok and not [r.flags for r in report.runs[0].rows if r.flags]


# -- increments absorbed by a running sum in another call -------------------------------------------

def test_a_running_sum_that_absorbs_increments_is_the_row_flagged_not_the_subtraction_after_it():
    """planted_round2.Dynamics: integ adds 0.01-increments to a value at 300 (bfloat16's step there is
    2), and the model subtracts 300 afterwards. The finding blamed integ; the rows flagged the root."""
    from tests.precision_check.planted_round2 import Dynamics

    torch.manual_seed(0)
    model, x = Dynamics(), torch.randn(4, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # the truth: the subtraction on integ's bfloat16 output, in float32, does not help
        truth = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = model.integ(x)
        assert h.dtype == torch.bfloat16 and _rel(model.out(h.float() - 300.0), truth) > 4 * BAR
    run = layerlab.precision_check(model, x).runs[0]
    first = next(f for f in run.findings if f.severity == "error")
    assert first.where == "integ" and "rounds away what (root) needs" in first.message, first.message
    assert run.row("integ").flags == ["precision"] and run.row("").flags == ["upstream"]
    _one_story(run)

"""Round-2 audit of precision-check: twelve planted low-precision bugs and stock models.

Each bug is first shown real with plain torch (float32 against ``torch.autocast("cpu", dtype)``),
then precision-check must name the module, the cause and a fix; where the fix is code, it is
applied (the module's ``fixed=True`` branch, written as the fix text says) and the check must
then pass. The misses this round fixed: ``1 - cos`` blamed on the norms as a variance (it is a
cancellation), an eps of 1e-12 (0 in float16) blamed on a variance, a temperature of 1e-3 and
Fourier features whose fix ("softmax/sin in float32") did not cure them (the input was already
rounded), increments absorbed by a large running value (was "I can't tell", on the wrong module),
and overflow fixes that missed the idiomatic rewrite (scale before the matmul, subtract the max).
Letters: B batch · L length · E features.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import layerlab
from layerlab.mixed.dtypes import autocast_supported
from tests.precision_check.planted_round2 import (
    Attention, Classifier, Scorer, Siamese, Dynamics, Standardized, Pick,
    Field, Cubic, Normed, Embedder, Deep,
)

FP16 = pytest.mark.skipif(autocast_supported("cpu", "float16") is not None, reason="no float16 autocast on this CPU")
EPS = {"bfloat16": torch.finfo(torch.bfloat16).eps, "float16": torch.finfo(torch.float16).eps}


def _truth(model: nn.Module, inputs, dtype: str) -> float:
    """Relative output error of autocast ``dtype`` against float32, by plain torch (inf: not finite)."""
    with torch.no_grad():
        ref = model(*inputs)
        with torch.autocast("cpu", dtype=getattr(torch, dtype)):
            low = model(*inputs).float()
    return math.inf if not torch.isfinite(low).all() else float((low - ref).norm() / ref.norm())


def _first(model, inputs, dtype):
    report = layerlab.precision_check(model, *inputs, autocast=[dtype])
    return report, report.runs[0].first


def _forward_errors(report):
    return [(f.kind, f.where) for f in report.findings if f.severity == "error" and f.kind != "underflow"]


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _build(cls, fixed=False):
    torch.manual_seed(0)
    return cls(fixed=fixed)


def _inputs(name):
    g = _gen()
    return {
        "attention": (torch.randn(2, 12, 16, generator=g),),
        "softmax": (torch.randn(4, 32, generator=g),),
        "softplus": (torch.randn(4, 16, generator=g),),
        "cosine": (torch.randn(8, 16, generator=g), 0.1 * torch.randn(8, 16, generator=g)),
        "integrator": (torch.randn(2, 32, 16, generator=g),),
        "eps": (torch.cat([torch.randn(3, 16, generator=g), torch.zeros(1, 16)]),),
        "temperature": (torch.randn(4, 24, 16, generator=g),),
        "fourier": (torch.rand(8, 3, generator=g),),
        "cubic": (torch.randn(4, 16, generator=g),),
        "rmsnorm": (torch.randn(4, 16, generator=g),),
        "l2": (torch.randn(4, 16, generator=g),),
    }[name]


#  name, model, dtype, blamed module, kind, Cause phrase, fix phrase
CASES = [
    ("attention", Attention, "float16", "attn", "overflow", "matmul (`scores = q @ k.transpose",
     "scaled_dot_product_attention"),
    ("softmax", Classifier, "float16", "softmax", "overflow", "exp (`e = torch.exp(x)`) reaches",
     "subtract the max first"),
    ("softplus", Scorer, "float16", "head", "overflow", "exp (`return F.softplus(z) if", "F.softplus"),
    ("cosine", Siamese, "bfloat16", "dist", "precision", "__rsub__ runs in bfloat16 (`return 1 - cos`)",
     "subtract in float32"),
    ("integrator", Dynamics, "bfloat16", "integ", "precision", "the small ones are rounded away",
     "make the running value float32 where it is created"),
    ("eps", Standardized, "float16", "std", "non-finite", "its eps 1e-12 is 0 in float16",
     "use an eps float16 can hold"),
    ("temperature", Pick, "bfloat16", "pick", "precision", "softmax runs in bfloat16", "cannot undo the rounding"),
    ("fourier", Field, "bfloat16", "ff", "precision", "sin runs in bfloat16", "cannot undo the rounding"),
    ("cubic", Cubic, "float16", "act", "overflow", "pow (`return x ** 3 / (1 + x ** 2)", "keep pow in float32"),
    ("rmsnorm", Normed, "float16", "norm", "precision", "pow (`return self.weight * x * torch.rsqrt(",
     "keep pow in float32"),
    ("l2", Embedder, "float16", "l2", "non-finite", "below float16's smallest normal",
     "compute the statistics in float32"),
]


@pytest.mark.parametrize("name,cls,dtype,where,kind,cause,fix", CASES, ids=[c[0] for c in CASES])
def test_planted_bug_is_named_and_its_fix_cures_it(name, cls, dtype, where, kind, cause, fix):
    if dtype == "float16" and autocast_supported("cpu", "float16") is not None:
        pytest.skip("no float16 autocast on this CPU build")
    model, x = _build(cls), _inputs(name)
    assert _truth(model, x, dtype) > 8 * EPS[dtype]  # the bug is real in plain torch
    report, first = _first(model, x, dtype)
    assert not report.ok and first is not None
    assert (first.where, first.kind) == (where, kind), first.message
    if name == "softplus":  # the source line differs: the bug line is the else branch of one expression
        cause = "exp (`return F.softplus(z) if self.fixed else torch.log(1 + torch.exp(z))`) reaches"
    assert cause in first.cause, first.cause
    assert fix in first.fix, first.fix
    cured = _build(cls, fixed=True)
    assert _truth(cured, x, dtype) < 8 * EPS[dtype]  # the fix is real in plain torch
    after = layerlab.precision_check(cured, *x, autocast=[dtype])
    if name == "attention":  # q and k get ~1e-12 of v's gradient through the saturated softmax: float16
        assert not _forward_errors(after), after.findings  # flushes them (underflow), a separate finding
    else:
        assert after.ok, [(f.kind, f.where, f.message) for f in after.findings]


@FP16
def test_a_residual_stream_past_65504_is_blamed_on_the_first_block_that_overflows():
    torch.manual_seed(0)
    model, x = Deep(), torch.randn(4, 16, generator=_gen())
    finished = []  # (module path, float32 max |output|) in the order calls finish
    hooks = [m.register_forward_hook(lambda m, i, o, n=n: finished.append((n, float(o.abs().max())))
                                     and None) for n, m in model.named_modules()]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    past = next(n for n, amax in finished if amax > 65504)  # the truth: the first output float16 cannot hold
    block = past if past.count(".") == 1 else past.rsplit(".", 1)[0]
    assert _truth(model, (x,), "float16") == math.inf and block == "layers.8"
    report, first = _first(model, (x,), "float16")
    assert (first.where, first.kind) == (past, "overflow"), (past, first.message)
    assert ("add (`return x + self.fc(x)`)" if past == block else "its output reaches") in first.cause
    assert first.fix.startswith("use bfloat16")
    assert layerlab.precision_check(model, x, autocast=["bfloat16"]).ok  # and bfloat16 cures it


def test_a_variance_is_not_blamed_without_a_subtraction_that_cancels():
    """``1 - cos``: the norms are fine (torch sums half precision in float32); the cancellation is
    the subtraction, which the old rule never reached because a norm came first."""
    model, x = _build(Siamese), _inputs("cosine")
    _, first = _first(model, x, "bfloat16")
    assert "E[x²] − E[x]²" not in first.cause and "× smaller than an operand" in first.cause, first.cause


def test_the_sensitive_rule_names_what_made_the_input():
    """Keeping only softmax (or sin) in float32 does not cure these: checked in plain torch, and
    the fix text names the producers of the input."""
    model, (x,) = _build(Pick), _inputs("temperature")
    with torch.no_grad():
        ref = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model.score(x.mean(1)).unsqueeze(1)
            v = model.val(x)
        p = (logits.float() / 1e-3).softmax(-1)  # softmax alone in float32, on rounded logits
        only_softmax = model.out((p @ v.float()).squeeze(1))
    assert float((only_softmax - ref).norm() / ref.norm()) > 8 * EPS["bfloat16"]
    _, first = _first(model, (x,), "bfloat16")
    assert "div (`return (logits / self.temperature)" in first.fix, first.fix
    _, first = _first(_build(Field), _inputs("fourier"), "bfloat16")
    size = float(first.cause.split("|x| = ")[1].split(" ")[0])
    step = 2.0 ** math.floor(math.log2(size)) * EPS["bfloat16"]  # bfloat16's spacing at the largest angle
    assert "ff.proj (Linear)" in first.fix and f"step is {step:.3g}:" in first.cause, (first.cause, first.fix)

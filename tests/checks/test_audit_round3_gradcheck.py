"""Audit round 3, gradcheck corners: 16 correct layers at numerical corners and 10 with subtle gradient bugs.

The truth is taken from plain torch (``torch.autograd.gradcheck`` in float64 with explicit
parameters, a float32 backward), never from layerlab. A correct layer must get no failure (the
kinks, ties and a large output make torch's own gradcheck fail it); a buggy one must fail the
check that sees the bug, name the tensor and say what is wrong.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.func import functional_call

import layerlab
from layerlab.checks.report import Status

from tests.checks import audit_round3_gradcheck_layers as L


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _x(seed=0, shape=(4, 6)):
    return torch.randn(*shape, generator=_g(seed))


def _torch_gradcheck(module, *inputs, eps=1e-6):
    """torch's own verdict on the float64 layer as a function of its float inputs and parameters."""
    m = copy.deepcopy(module).double()
    names = [n for n, _ in m.named_parameters()]
    xs = [x.double().requires_grad_() for x in inputs]
    ps = [p.detach().clone().requires_grad_() for p in m.parameters()]
    f = lambda *a: functional_call(m, dict(zip(names, a[len(xs):])), tuple(a[:len(xs)]))  # noqa: E731
    return torch.autograd.gradcheck(f, (*xs, *ps), eps=eps, raise_exception=False)


def _check(report, name):
    return next(c for c in report.checks if c.name == name)


def _failures(report):
    return [c for c in report.checks if c.status == Status.FAIL]


CORRECT = {
    "alt_formula_silu": lambda: (L.AltFormulaSiLU(), (_x(),), {}),
    "safe_where_log": lambda: (L.SafeWhereLog(), (_x(),), {}),
    "relu_hardtanh_on_kinks": lambda: (L.KinkActivation(), (torch.tensor([[-1.0, 0.0, 1.0, 0.5, -0.5, 2.0]] * 4),), {}),
    "max_pool_ties": lambda: (L.TiedMaxPool(), (torch.randint(0, 3, (2, 2, 4, 4), generator=_g(1)).float(),), {}),
    "sort_topk": lambda: (L.SortWeighted(), (_x(),), {}),
    "causal_attention_fully_masked_rows": lambda: (
        L.CausalMaskedAttention(), (_x(2, (2, 5, 8)), torch.tensor([[True] + [False] * 4, [False] * 4 + [True]])),
        {"tags": ["causal"]}),
    "int_and_float_inputs": lambda: (L.GatherMix(), (_x(), torch.randint(0, 10, (4,), generator=_g(3))), {}),
    "inplace_ops": lambda: (L.InplaceOps(), (_x(),), {}),
    "tuple_with_argmax": lambda: (L.TupleWithArgmax(), (_x(),), {}),
    "batchnorm_running_stats_train": lambda: (L.MyBatchNorm1d(), (_x(5, (8, 6)),), {}),
    "dropout_train": lambda: (L.MyDropout(), (_x(),), {}),
    "hardtanh_on_plus_minus_1": lambda: (
        L.HardtanhKinks(), (torch.tensor([[-1.0, 1.0, 0.3, -0.7, 1.5, -2.0], [1.0, -1.0, 0.2, 0.6, -0.1, 3.0]]),), {}),
    "clamp_at_bound": lambda: (
        L.ClampHalf(), (torch.tensor([[0.5, -0.5, 0.1, 0.2, -0.3, 0.4], [0.5, 0.25, -0.5, 0.11, 0.7, -0.9]]),), {}),
    "big_offset": lambda: (L.BigOffset(), (_x(),), {}),
}


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_correct_layer_gets_no_failure(name):
    torch.manual_seed(0)
    module, inputs, kw = CORRECT[name]()
    report = layerlab.verify(module, *inputs, **kw)
    assert not _failures(report), "\n".join(f"{c.name}: {c.summary}" for c in _failures(report))
    assert _check(report, "gradcheck").status == Status.PASS


def test_a_complex_parameter_is_not_judged_on_a_real_float64_copy():
    """nn.Module.to(float64) drops a complex parameter's imaginary part (torch warns): a gradcheck of that
    copy checked another layer. The checks that run a float64 copy say so instead of passing it."""
    import warnings

    module, (x,), _ = L.FFTFilter(), (_x(4, (3, 16)),), {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real = copy.deepcopy(module).to(torch.float64)
    assert not real.filt.is_complex()  # the truth: the cast copy is another layer
    assert not torch.allclose(real(x.double()).float(), module(x), atol=1e-3)
    report = layerlab.verify(module, x)
    grad = _check(report, "gradcheck")
    assert grad.status == Status.SKIP and "filt is complex" in grad.summary and not _failures(report)


@pytest.mark.parametrize("name, why", [
    ("relu_hardtanh_on_kinks", "off the kinks"), ("max_pool_ties", "off the kinks"),
    ("hardtanh_on_plus_minus_1", "off the kinks"), ("clamp_at_bound", "off the kinks")])
def test_torch_gradcheck_itself_fails_these_correct_layers_at_their_kinks(name, why):
    torch.manual_seed(0)
    module, inputs, _ = CORRECT[name]()
    assert not _torch_gradcheck(module, *[x for x in inputs if x.is_floating_point()])
    assert why in _check(layerlab.verify(module, *inputs), "gradcheck").summary


def test_large_output_rounding_is_not_a_wrong_gradient():
    # Linear(x) + 1e8: torch's gradcheck fails it at its default step (float64 rounding of a 1e8
    # output moves the finite difference by ~1e-2) and passes it at a step of 1e-2
    torch.manual_seed(0)
    module, (x,), _ = CORRECT["big_offset"]()
    assert not _torch_gradcheck(module, x)
    assert _torch_gradcheck(module, x, eps=1e-2)
    c = _check(layerlab.verify(module, x), "gradcheck")
    assert c.status == Status.PASS
    assert "the output reaches 1e+08" in c.summary and "at a step of 0.01" in c.summary


def test_large_output_does_not_hide_a_wrong_backward():
    class BigOffsetNo2(L.SquareMissing2):  # the dropped factor 2, plus a 1e8 offset
        def forward(self, x):
            return super().forward(x) + 1e8

    torch.manual_seed(0)
    module = BigOffsetNo2()
    with torch.no_grad():
        module.lin.weight.mul_(1e-3)  # a mismatch small enough to sit inside the rounding band at 1e-6
    x = _x()
    assert not _torch_gradcheck(module, x, eps=1e-2)
    c = _check(layerlab.verify(module, x), "gradcheck")
    assert c.status == Status.FAIL, c.summary
    assert "ratio analytical/numerical 0.5" in c.summary


BUGGY = {
    "sign_flipped_param_grad": (lambda: (L.ScaleSignBug(), (_x(),)), "gradcheck", "w", "a sign flipped"),
    "dropped_factor_2": (lambda: (L.SquareMissing2(), (_x(),)), "gradcheck", "x", "a factor 2 dropped"),
    "detached_residual": (lambda: (L.DetachedResidual(), (_x(),)), "gradcheck", "x", ".detach()"),
    "swapped_grads": (lambda: (L.SwappedGrads(), (_x(), _x(6))), "gradcheck", "a", "wrong order"),
    "unstable_softplus_backward": (lambda: (L.UnstableSoftplus(), (_x(),)), "param_grads", "lin.weight", "overflow"),
    "bias_grad_mean_not_sum": (lambda: (L.BiasMeanGrad(), (_x(7, (2, 3, 6)),)), "gradcheck", "b", "1/6"),
    "norm_backward_without_mean_term": (lambda: (L.NormNoMeanTerm(), (_x(8),)), "gradcheck", "x", "custom autograd"),
    "gelu_backward_wrong_constant": (lambda: (L.GeluWrongConst(), (2 * _x(),)), "gradcheck", "x", "custom autograd"),
    "unsafe_where_sqrt": (lambda: (L.UnsafeWhereSqrt(), (_x(),)), "gradcheck", "x", "torch.where"),
}


@pytest.mark.parametrize("name", sorted(BUGGY))
def test_buggy_layer_fails_and_names_the_bug(name):
    build, check, where, said = BUGGY[name]
    torch.manual_seed(0)
    module, inputs = build()
    if name == "unstable_softplus_backward":  # the truth: float64 passes, float32 backward is NaN
        assert _torch_gradcheck(module, *inputs)
        m32, x = copy.deepcopy(module), inputs[0].clone().requires_grad_()
        m32(x).sum().backward()
        assert not torch.isfinite(m32.lin.weight.grad).all()
    else:
        assert not _torch_gradcheck(module, *inputs)
    c = _check(layerlab.verify(module, *inputs), check)
    assert c.status == Status.FAIL, c.summary
    assert where in (c.where or "")
    assert said in c.summary + " " + (c.hint or "")

"""The cheap paths of layerlab.mixed give the numbers the expensive ones gave.

A model made only of torch.nn modules runs in place (no deepcopy) and gets its buffers back;
anything with a user-written forward runs on a copy. Parameter-gradient errors are float32 norms
with a float64 fallback; they are checked here against plain torch autocast runs in float64.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import layerlab
from layerlab.mixed import runs
from layerlab.mixed.capture import all_finite
from layerlab.probe.backward import random_projection


def _conv_bn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 6 * 6, 5)), torch.randn(4, 3, 6, 6)


def test_stock_model_runs_in_place_and_gets_its_buffers_back(monkeypatch):
    model, x = _conv_bn()
    assert runs.stateless(model)
    before = copy.deepcopy(model.state_dict())
    in_place = layerlab.precision_check(model, x)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # running stats, num_batches_tracked
    assert all(p.grad is None for p in model.parameters())
    moved = copy.deepcopy(model)
    moved(x)  # a train-mode forward does move the statistics: the restore is real
    assert not torch.equal(moved[1].running_mean, before["1.running_mean"])
    # the same report as the path that runs on copies
    monkeypatch.setattr(runs, "stateless", lambda module, modules=None: False)
    copied = layerlab.precision_check(model, x)
    a, b = in_place.runs[0], copied.runs[0]
    assert [(r.label, r.error, r.grad_error) for r in a.rows] == [(r.label, r.error, r.grad_error) for r in b.rows]
    assert [(p.name, p.error) for p in a.params] == [(p.name, p.error) for p in b.params]


class _Counting(nn.Module):
    """A user forward that changes the module's own state: it must never run on the user's module."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


def test_user_forward_with_state_runs_on_a_copy():
    model = _Counting()
    assert not runs.stateless(model)
    report = layerlab.precision_check(model, torch.randn(3, 4))
    assert report.ok and model.calls == 0


def test_stock_module_with_a_user_hook_runs_on_a_copy():
    model = nn.Linear(4, 4)
    model.register_forward_hook(lambda m, i, o: None)
    assert not runs.stateless(model)


def test_parameter_gradient_errors_are_torchs():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 8))
    x = torch.randn(32, 16)
    report = layerlab.precision_check(model, x, autocast=["bfloat16"])

    def grads(autocast: bool):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(x)
        [r] = random_projection([out], 0)  # the check's loss: a seeded projection of the output
        return torch.autograd.grad(out, list(model.parameters()), grad_outputs=r.to(out.dtype))

    ref, half = grads(False), grads(True)
    names = [n for n, _ in model.named_parameters()]
    by_name = {p.name: p.error for p in report.runs[0].params}
    for name, g, h in zip(names, ref, half):
        expected = float(torch.linalg.vector_norm(h.double() - g.double()) / torch.linalg.vector_norm(g.double()))
        assert expected > 0 and by_name[name] == pytest.approx(expected, rel=1e-5), name


def test_all_finite_tells_a_large_sum_from_an_inf():
    big = torch.full((4,), 3e38)
    assert math.isinf(float(big.sum())) and all_finite(big)  # the sum overflows, no element does
    assert all_finite(torch.full((8,), 60000.0, dtype=torch.float16))
    assert not all_finite(torch.tensor([1.0, math.inf]))
    assert not all_finite(torch.tensor([1.0, math.nan]))
    assert not all_finite(torch.tensor([math.inf, -math.inf]))


def _layers():
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "precision_layers.py")
    spec = importlib.util.spec_from_file_location("precision_layers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cancellation_is_blamed_on_the_subtraction_not_on_the_mean():
    torch.manual_seed(0)
    model, x = _layers().OffsetCentre(16), torch.randn(256, 16)
    with torch.no_grad():
        fp32 = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(x)
    eps = torch.finfo(torch.bfloat16).eps
    assert float((low.float() - fp32).norm() / fp32.norm()) > 8 * eps  # the bug is real
    ones = torch.ones(4096, dtype=torch.bfloat16)
    assert float(ones.sum()) == 4096.0  # torch sums bf16 in float32: a "long sum" is not the cause
    first = layerlab.precision_check(model, x, autocast=["bfloat16"]).runs[0].first
    assert first.where == "(root)" and first.cause.startswith("sub runs in bfloat16")
    assert first.source.endswith("precision_layers.py:" + str(_line_of("return h - h.mean()")))
    assert "offset" in first.fix and "float32" in first.fix


def _line_of(text: str) -> int:
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "precision_layers.py")
    with open(path) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


class _ShapeByDtype(nn.Module):
    """Keeps the outputs above 0.1: how many there are depends on rounding (a data-dependent shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 64)

    def forward(self, x):
        y = self.lin(x)
        return y[y > 0.1]


def test_outputs_of_other_shapes_in_half_are_a_warning_not_a_raise():
    torch.manual_seed(3)
    model, x = _ShapeByDtype(), torch.randn(64, 8)
    with torch.no_grad():
        fp32 = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(x)
    assert fp32.shape != low.shape  # rounding moved elements across 0.1: real
    report = layerlab.precision_check(model, x, autocast=["bfloat16"])
    [finding] = report.runs[0].findings
    assert report.ok and finding.severity == "warning" and "other shapes" in finding.message


def test_batched_relative_errors_equal_the_pair_by_pair_ones():
    from layerlab.mixed.capture import Seen
    from layerlab.mixed.compare import rel_error, rel_errors

    gen = torch.Generator().manual_seed(0)

    def seen(t, finite=True):
        return Seen(sample=t, numel=t.numel(), dtype="float32", amax=None, finite=finite)

    refs = [seen(torch.randn(n, generator=gen)) for n in (4096, 4096, 100, 7)]
    halves = [seen(r.sample.to(torch.bfloat16).float()) for r in refs]
    halves.append(seen(torch.tensor([1.0, float("inf")]), finite=False))
    refs.append(seen(torch.tensor([1.0, 2.0])))
    pairs = list(zip(halves, refs)) + [(halves[0], refs[0])]  # a repeated pair is measured once
    batched = rel_errors(pairs)
    for h, r in pairs:
        expected = rel_error(h, r)
        got = batched[(id(h), id(r))]
        assert got == expected or abs(got - expected) <= 1e-12 * max(1.0, expected), (got, expected)
    # and against torch directly: ‖half − ref‖ / ‖ref‖ in float64
    x, y = halves[0].sample.double(), refs[0].sample.double()
    assert abs(batched[(id(halves[0]), id(refs[0]))] - float((x - y).norm() / y.norm())) < 1e-12
    assert batched[(id(halves[-1]), id(refs[-1]))] == float("inf")


def test_abs_max_from_the_bits_equals_torch_on_every_sign_nan_and_inf_mix():
    """``stats.abs_max`` reads max |x| off integer bits where one sign is set: every combination of
    ±0, ±1.5/2.5, ±inf, ±NaN, subnormals and large values, in four dtypes, against float64 torch."""
    import itertools

    from layerlab.probe.stats import abs_max

    values = [0.0, -0.0, 1.5, -2.5, math.inf, -math.inf, math.nan, -math.nan, 1e-40, -1e-40, 65504.0, 3e38]
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for k in (1, 2, 3):
            for combo in itertools.product(values, repeat=k):
                t = torch.tensor(combo, dtype=torch.float64).to(dtype)
                wide = t.double()
                want = math.nan if bool(torch.isnan(wide).any()) else float(wide.abs().max())
                got = abs_max(t)
                assert (math.isnan(got) and math.isnan(want)) or got == want, (dtype, combo, got, want)
        torch.manual_seed(0)
        x = (torch.randn(64, 33) * 10).to(dtype)
        for t in (x, torch.relu(x), -torch.relu(x), x.t()):  # mixed signs, one sign, non-contiguous
            assert abs_max(t) == float(t.double().abs().max())
    assert abs_max(torch.empty(0)) == 0.0


def test_the_underflow_share_is_measured_wherever_it_could_reach_the_bar():
    """grad_sums skips the flushed norm only where ‖g‖ > 2⁻²⁵·√n / 1 %, which bounds the share below 1 %;
    a gradient made mostly of values below 2⁻²⁵ is measured, and equals the direct computation."""
    from layerlab.mixed.compare import FLUSHED, flushed_share, grad_sums
    from layerlab.mixed.dtypes import UNDERFLOW_FRACTION

    ref = runs.RunResult(setting=runs.FLOAT32)
    tiny = torch.full((1000,), FLUSHED / 2)
    tiny[:3] = 1e-7  # a few elements above the flush line: share = ‖tiny part‖ / ‖g‖ ≈ 0.9
    big = torch.randn(1000)
    ref.grads = {"tiny": tiny, "big": big}
    sums = grad_sums(ref)
    direct = float(torch.linalg.vector_norm(torch.where(tiny.abs() < FLUSHED, tiny, 0.0)) / torch.linalg.vector_norm(tiny))
    assert sums["tiny"][2] is not None and flushed_share(ref, "tiny") == pytest.approx(direct, rel=1e-6)
    assert direct > UNDERFLOW_FRACTION
    assert sums["big"][2] is None and flushed_share(ref, "big") == 0.0
    # the bound that let it skip: no split of n elements below 2⁻²⁵ can carry 1 % of this norm
    assert FLUSHED * math.sqrt(big.numel()) < UNDERFLOW_FRACTION * float(torch.linalg.vector_norm(big))


def test_a_view_of_a_tensor_already_seen_gets_the_same_samples_and_a_mutated_one_does_not():
    """Flatten's output (a view of the pool's) is looked at once; after an in-place change the
    same memory is looked at again (its version moved)."""
    from layerlab.mixed.capture import Capture

    capture = Capture(nn.Identity(), seed=0)
    x = torch.randn(8, 16, 16, 16)
    first = capture._see(x, measure=True)
    flat = x.flatten(1)
    assert capture._see(flat, measure=True) is first  # same elements in the same order
    x.mul_(1e6)  # in place: the view shares the version counter
    again = capture._see(flat, measure=True)
    assert again is not first and again.amax == pytest.approx(first.amax * 1e6, rel=1e-6)
    assert torch.equal(again.sample, first.sample * 1e6)
    strided = x[:, ::2]  # not contiguous: never matched by memory
    assert capture._see(strided) is not again


def test_an_input_the_half_run_shares_is_looked_at_once_and_only_while_unchanged():
    """The autocast run reuses the float32 run's look at the model's own inputs (the same tensors,
    unchanged); an input the model changes in place is looked at again."""
    torch.manual_seed(0)
    model, x = _conv_bn()
    ref = runs.run(model, [_arg(x)], runs.FLOAT32, seed=0)
    half = runs.run(model, [_arg(x)], runs.Setting("autocast", "bfloat16"), seed=0, reference=ref)
    key = ("", 1)
    assert half.calls[key].inputs[0] is ref.calls[key].inputs[0]

    class Scales(nn.Module):  # changes its input in place: a user-written forward, run on a copy
        def forward(self, x):
            return x.mul_(2.0)

    y = torch.randn(4, 3)
    ref = runs.run(Scales(), [_arg(y)], runs.FLOAT32, seed=0)
    before = ref.calls[key].inputs[0]
    half = runs.run(Scales(), [_arg(y)], runs.Setting("autocast", "bfloat16"), seed=0, reference=ref)
    seen = half.calls[key].inputs[0]
    assert seen is not before and torch.equal(seen.sample, before.sample * 2)


def _arg(value):
    from layerlab.target.bind import Arg

    return Arg(name="input", value=value)

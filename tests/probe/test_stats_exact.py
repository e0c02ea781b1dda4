"""The CPU statistics shortcuts (integer views, ``amin`` alone, numpy counts) against torch's own
reductions, on the outputs of real layers where each shortcut is taken."""

import pytest
import torch

from layerlab.probe.stats import finish_stats, tensor_stats


def _stats(x, may_read=True):
    return finish_stats([tensor_stats(x, may_read=may_read)])[0]


def _assert_matches_torch(x):
    s = _stats(x)
    ref = x.double()
    assert (s.min, s.max) == (ref.min().item(), ref.max().item())
    assert s.zeros == (x == 0).sum().item() / x.numel()  # == counts -0.0 as zero too
    assert s.mean == pytest.approx(ref.mean().item(), rel=1e-5, abs=1e-6)
    assert s.std == pytest.approx(ref.std(unbiased=False).item(), rel=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_layer_outputs_with_negative_zeros(dtype):
    """Hard-swish (x·relu6(x+3)/6 is -0.0 below -3) and dropout (a negative times 0) make -0.0:
    the count of zeros must include them, large enough (4096 elements) for the numpy count."""
    torch.manual_seed(0)
    x = (torch.randn(8, 512) * 3).to(dtype)
    hardswish = torch.nn.Hardswish()(x)
    assert (hardswish.view(hardswish.dtype).double() == 0).any()
    assert torch.signbit(hardswish[hardswish == 0]).any()  # really -0.0 there
    dropped = torch.nn.Dropout(0.5).train()(x)
    for out in (hardswish, dropped, -dropped.abs(), torch.relu(x)):
        _assert_matches_torch(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_zero_ties_match_the_deferred_path(dtype):
    """Where the min or max is a zero and both signs of zero are there, the reported zero is the one
    torch.aminmax reports (as on the accelerator path): -0.0 and 0.0 must not be mixed up."""
    for values in ([-1.0, -0.0, 0.0], [-0.0, 0.0, 2.0], [-0.0, 3.0], [-2.0, 0.0], [0.0, -0.0]):
        x = torch.tensor(values * 700, dtype=dtype)
        now, later = finish_stats([tensor_stats(x, may_read=True), tensor_stats(x, may_read=False)])
        assert repr(now) == repr(later), values
        assert now.zeros == (x == 0).sum().item() / x.numel()


def test_mixed_signs_without_zeros_and_non_contiguous():
    torch.manual_seed(1)
    conv = torch.nn.Conv2d(3, 8, 3)
    with torch.no_grad():
        out = conv(torch.randn(2, 3, 40, 40))
    _assert_matches_torch(out)
    _assert_matches_torch(out.transpose(1, 3))  # a strided view: counted and reduced in place


def test_large_parameter_norms_are_accurate_and_the_same_without_backward():
    """A 1 M-value weight and its gradient: norms within 5e-6 of float64 (torch's fused norm is off
    by about 1e-5 at this size; ``dot``'s own rounding depends on the BLAS kernel the CPU gets, 1e-7
    to 1.3e-6 measured here), and the weight's norm the same with and without a backward pass."""
    import layerlab

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(4096, 256), torch.nn.Linear(256, 4))
    ids = torch.randint(0, 4096, (8, 16))
    report = layerlab.inspect(model, ids)
    weight = model[0].weight
    record = next(p for p in report.params if p.name == "0.weight")
    assert record.norm == pytest.approx(weight.double().norm().item(), rel=5e-6)
    loss_grad = torch.autograd.grad(
        model(ids), weight, grad_outputs=_projection(report, model(ids)))[0]
    assert record.grad_norm == pytest.approx(loss_grad.double().norm().item(), rel=5e-6)
    again = layerlab.inspect(model, ids, backward=False)
    assert next(p for p in again.params if p.name == "0.weight").norm == record.norm


def _projection(report, out):
    """The output gradient inspect used: its seeded unit-norm draw (see layerlab.probe.backward)."""
    from layerlab.probe.backward import random_projection

    assert report.backward.ran
    return random_projection([out], 0)[0]

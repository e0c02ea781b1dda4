"""The cheap statistics against torch, on both paths: CPU (may read a value to skip work) and the
accelerator path (nothing read until the end), which runs here on CPU tensors."""

import math

import pytest
import torch

from layerlab.probe.stats import count_nonzero, finish_norms, finish_stats, l2_norms, tensor_stats


def _stats(x, may_read):
    return finish_stats([tensor_stats(x, may_read=may_read)])[0]


@pytest.mark.parametrize("may_read", [True, False], ids=["cpu-path", "accelerator-path"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_finite_stats(may_read, dtype):
    torch.manual_seed(0)
    x = torch.relu(torch.randn(64, 33)).to(dtype)
    x[0, :5] = -0.0
    s = _stats(x, may_read)
    ref = x.double()
    assert s.numel == x.numel() and s.nan == 0 and s.inf == 0
    assert s.mean == pytest.approx(ref.mean().item(), rel=1e-3, abs=1e-3)
    assert s.std == pytest.approx(ref.std(unbiased=False).item(), rel=1e-2)
    assert s.min == ref.min().item() and s.max == ref.max().item()
    assert s.zeros == pytest.approx((ref == 0).double().mean().item())


@pytest.mark.parametrize("may_read", [True, False], ids=["cpu-path", "accelerator-path"])
def test_nan_and_inf_are_counted(may_read):
    x = torch.tensor([1.0, float("nan"), float("inf"), -2.0, float("nan"), 0.0])
    s = _stats(x, may_read)
    assert (s.nan, s.inf, s.numel) == (2, 1, 6)
    if may_read:  # the CPU path describes the finite elements
        assert (s.min, s.max) == (-2.0, 1.0) and s.mean == pytest.approx(-1 / 3)
        assert s.zeros == pytest.approx(1 / 6)
    else:
        assert math.isnan(s.mean)


def test_all_nonfinite_and_empty_and_integers():
    s = _stats(torch.full((3,), float("nan")), True)
    assert s.nan == 3 and math.isnan(s.mean)
    assert tensor_stats(torch.empty(0)) is None
    s = _stats(torch.tensor([[0, 5], [2, 0]]), True)
    assert (s.min, s.max, s.zeros, s.mean) == (0, 5, 0.5, 1.75)


def test_count_nonzero_ignores_the_sign_of_zero():
    x = torch.tensor([0.0, -0.0, 3.0, -0.0, -1.0])
    assert int(count_nonzero(x, True)) == 2 and int(count_nonzero(x, False)) == 2
    assert int(count_nonzero(torch.tensor([1.0, 0.0]), True)) == 1


def test_norms_fused_and_converted_once():
    ts = [torch.ones(4), torch.full((2, 2), 2.0, dtype=torch.float64)]
    assert finish_norms(l2_norms(ts)) == [2.0, 4.0]
    assert finish_norms([None, l2_norms([torch.ones(1)])[0]]) == [None, 1.0]

"""The shortcuts that keep ``inspect`` cheap give the same answers as the plain way."""

import math

import pytest
import torch

from layerlab.probe import backward, formula
from layerlab.probe.stats import finish_stats, grad_norm, l2_norm, tensor_stats


def _signed_cases(dtype):
    torch.manual_seed(0)
    x = torch.randn(300).to(dtype)
    negative = -(x.abs() + 1)
    negative[::7] = -0.0
    relu = x.relu()
    relu[::5] = -0.0
    cases = {
        "mixed": x,
        "mixed with -0.0": torch.where(x > 1, torch.tensor(-0.0, dtype=dtype), x),
        "relu": x.relu(),
        "relu with -0.0": relu,
        "positive": x.abs() + 1,
        "negative": -(x.abs() + 1),
        "negative with -0.0": negative,
        "zeros": torch.zeros(5, dtype=dtype),
        "minus zeros": torch.full((5,), -0.0, dtype=dtype),
        "transposed": x.view(20, 15).t(),
    }
    return cases


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_read_at_once_equals_the_deferred_path(dtype):
    for name, x in _signed_cases(dtype).items():
        now, later = finish_stats([tensor_stats(x, may_read=True), tensor_stats(x, may_read=False)])
        assert repr(now) == repr(later), name  # repr: -0.0 and 0.0 must not be mixed up


def test_grad_norm_is_the_l2_norm():
    torch.manual_seed(0)
    g = torch.randn(64, 33)
    assert grad_norm(g).item() == pytest.approx(l2_norm(g).item(), rel=1e-6)
    assert grad_norm(g.t()).item() == pytest.approx(l2_norm(g).item(), rel=1e-6)  # strided path
    g[0, 0] = float("nan")
    assert math.isnan(grad_norm(g).item())
    g[0, 0] = float("-inf")
    assert math.isinf(grad_norm(g).item())


def test_projection_is_reused_but_never_seen_written():
    outs = [torch.randn(4, 5), torch.randn(3)]
    first = backward.random_projection(outs, 3)
    again = backward.random_projection(outs, 3)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    flat = torch.cat([p.reshape(-1) for p in first])
    assert torch.linalg.vector_norm(flat).item() == pytest.approx(1.0, rel=1e-6)
    expected = [p.clone() for p in first]
    again[0].mul_(5)  # e.g. a user's gradient hook working in place
    fresh = backward.random_projection(outs, 3)
    assert all(torch.equal(a, b) for a, b in zip(fresh, expected))
    other_seed = backward.random_projection(outs, 4)
    assert not torch.equal(other_seed[0], expected[0])


def test_remembered_formulas_keep_argument_types():
    assert formula._cache_key("max_pool2d", [1, 1, 8, 8], {"ceil_mode": True}) != formula._cache_key(
        "max_pool2d", [1, 1, 8, 8], {"ceil_mode": 1}
    )
    assert formula._cache_key("x", [1], {"size": (1, True)}) is None  # not remembered
    assert formula._cache_key("x", [1], {"padding": object()}) is None

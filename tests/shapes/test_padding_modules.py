"""The padding modules and FractionalMaxPool2d/3d, checked against real torch on grids of cases.

Padding: every kind (reflection, replication, zero, circular, constant) × 1d/2d/3d × batched,
unbatched, wrong-rank and empty inputs × int, negative, odd-length, too-long and short tuples
(reflect padding ≥ the input size, circular > size, crops below 0 and the reflect kernels'
unsupported ranks included). FractionalMaxPool: output_size / output_ratio, both, neither,
kernel sizes that do not fit, empty dims, unbatched inputs — module and ``F.`` name alike.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from layerlab.errors import TorchWouldRaise
from layerlab.shapes import explain, output_shape
from tests.shapes.oracle import assert_same_outcome, layerlab_outcome, torch_outcome

KINDS = {"reflection": "Reflection", "replication": "Replication", "zero": "Zero", "circular": "Circular",
         "constant": "Constant"}


def _pad_cases(nd):
    shapes = [(1, 2) + (3,) * nd, (2,) + (3,) * nd, (3,) * nd, (1, 1, 1) + (3,) * nd, (0, 1) + (3,) * nd,
              (1, 0) + (3,) * nd, (1, 1) + (1,) * nd, (4,)]
    pads = [1, 2, 3, 4, 0, -1, -2, -4, (1,) * (2 * nd + 1), (1, 2) * (nd - 1) if nd > 1 else (1, 2, 3, 4),
            tuple(range(2 * nd)), tuple(-x for x in range(2 * nd))]
    return list(itertools.product(shapes, pads))


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_padding_modules_match_torch(kind, nd):
    cls = getattr(nn, f"{KINDS[kind]}Pad{nd}d")
    raised = 0
    for shape, padding in _pad_cases(nd):
        args = (padding, 0.5) if kind == "constant" else (padding,)
        theirs = torch_outcome(lambda: cls(*args)(torch.zeros(shape)))
        params = dict(padding=padding, value=0.5) if kind == "constant" else dict(padding=padding)
        ours = layerlab_outcome(f"nn.{KINDS[kind]}Pad{nd}d", shape, **params)
        assert_same_outcome(ours, theirs, f"{cls.__name__}({padding}) on {shape}")
        raised += theirs.raised
    assert 0 < raised < len(_pad_cases(nd))  # the grid has both outcomes


@pytest.mark.parametrize("op,shape,padding,expected", [
    ("ReflectionPad2d", (1, 1, 3, 3), 3, ("RuntimeError", "Argument #4: Padding size should be less than the "
     "corresponding input dimension, but got: padding (3, 3) at dimension 3 of input [1, 1, 3, 3]")),
    ("ReflectionPad2d", (1, 3, 3), 2, (1, 7, 7)),                    # unbatched
    ("CircularPad2d", (1, 3, 3), 3, (1, 9, 9)),                      # circular allows padding == size
    ("CircularPad1d", (4,), 1, ("ValueError", "expected 2D or 3D input (got 1D input)")),
    ("ConstantPad1d", (1, 4), (-5, 3), ("RuntimeError", "narrow(): length must be non-negative.")),
    ("ZeroPad2d", (1, 1, 4), (1, 1), (1, 1, 6)),                     # a 2-value tuple pads one dim
])
def test_padding_edge_cases(op, shape, padding, expected):
    args = (padding, 0.0) if op.startswith("Constant") else (padding,)  # ConstantPad needs a value
    theirs = torch_outcome(lambda: getattr(nn, op)(*args)(torch.zeros(shape)))
    if isinstance(expected[0], str):
        assert (theirs.exc, theirs.message) == expected
        with pytest.raises(TorchWouldRaise) as info:
            output_shape(f"nn.{op}", shape, padding=padding)
        assert (info.value.torch_exception, info.value.torch_message) == expected
    else:
        assert theirs.shape == expected == output_shape(op, shape, padding=padding)


def test_replicate_pad_follows_the_torch_version_table():
    """Replicate padding of 2 dims with one size < 1: 2.13 allocates (negative size), 2.14 words it."""
    theirs = torch_outcome(lambda: nn.ReplicationPad2d((0, 0, -3, 0))(torch.zeros(1, 1, 2, 4)))
    ours = layerlab_outcome("ReplicationPad2d", (1, 1, 2, 4), padding=(0, 0, -3, 0))
    if torch.__version__.startswith("2.13"):
        assert_same_outcome(ours, theirs)
    newer = explain("ReplicationPad2d", (1, 1, 2, 4), torch_version="2.14.1", padding=(0, 0, -3, 0))
    assert newer.error.torch_message.startswith("Calculated output H: -1 W: 4 must be >= 1")


def test_padding_steps_show_each_padded_dim():
    ex = explain("nn.ReflectionPad2d", (1, 1, 5, 6), padding=(1, 2, 3, 0))
    assert [(s.dim, s.substituted, s.output) for s in ex.steps] == [("H", "5 + 3 + 0", 8), ("W", "6 + 1 + 2", 9)]


def _fractional_cases(nd):
    full = (1, 2) + (9,) * nd
    shapes = [full, full[1:], (0,) + full[1:], (1, 0) + full[2:], (0,) + (9,) * nd, (9,) * nd, (1,) + full,
              full[:-1] + (0,)]
    kw = [dict(kernel_size=2, output_size=4), dict(kernel_size=3, output_ratio=0.5), dict(kernel_size=2, output_size=8),
          dict(kernel_size=2, output_size=9), dict(kernel_size=3, output_ratio=(0.5, 0.7) + (0.6,) * (nd - 2)),
          dict(kernel_size=2, output_ratio=0.05), dict(kernel_size=2), dict(kernel_size=2, output_size=3, output_ratio=0.5),
          dict(kernel_size=2, output_ratio=1.0), dict(kernel_size=0, output_size=3), dict(kernel_size=-1, output_size=3),
          dict(kernel_size=2, output_size=0), dict(kernel_size=2, output_size=-1), dict(kernel_size=(2,) * (nd + 1), output_size=3),
          dict(kernel_size=2, output_size=(3,) * (nd + 1)), dict(kernel_size=10, output_size=1),
          dict(kernel_size=2, output_ratio=(0.5,) * (nd + 1)), dict(kernel_size=2, output_ratio=(0.5,) * (nd - 1)),
          dict(kernel_size=2, output_size=(8,) * (nd - 1) + (9,)), dict(kernel_size=2, output_size=(9,) + (8,) * (nd - 1))]
    return list(itertools.product(shapes, kw))


@pytest.mark.parametrize("nd", [2, 3])
@pytest.mark.parametrize("api", ["module", "functional"])
def test_fractional_max_pool_matches_torch(nd, api):
    cls, fn = getattr(nn, f"FractionalMaxPool{nd}d"), getattr(F, f"fractional_max_pool{nd}d")
    op = f"nn.FractionalMaxPool{nd}d" if api == "module" else f"F.fractional_max_pool{nd}d"
    for shape, params in _fractional_cases(nd):
        call = (lambda: cls(**params)(torch.zeros(shape))) if api == "module" else \
            (lambda: fn(torch.zeros(shape), **params))
        assert_same_outcome(layerlab_outcome(op, shape, **params), torch_outcome(call), f"{op} {shape} {params}")


def test_fractional_3d_size_check_is_strict():
    """3d needs out + k − 1 < L (2d: ≤): 9 → 8 with k=2 works in 2d, not in 3d."""
    assert output_shape("FractionalMaxPool2d", (1, 1, 9, 9), kernel_size=2, output_size=8) == (1, 1, 8, 8)
    theirs = torch_outcome(lambda: nn.FractionalMaxPool3d(2, output_size=8)(torch.zeros(1, 1, 9, 9, 9)))
    with pytest.raises(TorchWouldRaise) as info:
        output_shape("FractionalMaxPool3d", (1, 1, 9, 9, 9), kernel_size=2, output_size=8)
    assert (info.value.torch_exception, info.value.torch_message) == (theirs.exc, theirs.message)


@pytest.mark.parametrize("module,shape", [
    (nn.ReflectionPad2d((1, 2, 0, 3)), (2, 3, 5, 6)),
    (nn.ReplicationPad1d(2), (3, 7)),
    (nn.CircularPad3d(1), (1, 1, 2, 3, 4)),
    (nn.ZeroPad2d(-1), (1, 1, 5, 5)),
    (nn.ConstantPad1d((2, -1), 3.5), (2, 4)),
    (nn.FractionalMaxPool2d(3, output_ratio=0.5), (2, 3, 11, 9)),
    (nn.FractionalMaxPool2d(2, output_size=(4, 3)), (3, 9, 9)),
    (nn.FractionalMaxPool3d(2, output_size=3), (1, 1, 6, 7, 8)),
], ids=lambda v: type(v).__name__ if isinstance(v, nn.Module) else None)
def test_inspect_formula_check_passes_for_the_new_modules(module, shape):
    import layerlab

    report = layerlab.inspect(module, torch.randn(*shape), backward=False)
    assert len(report.checks) == 1, report.checks
    check = report.checks[0]
    assert check.passed is True, check
    assert check.predicted == check.actual == list(module(torch.randn(*shape)).shape)

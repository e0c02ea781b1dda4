"""``F.`` op names answer with the functional's semantics, checked against the real functional.

Module names keep the module's semantics (its constructor's ValueErrors); ``F.conv2d``,
``torch.nn.functional.interpolate`` … have no constructor: ATen's checks and messages, and
cases only the module refuses are accepted. Every case runs the real torch op (the weight that
explain-shape describes: ``(out, in/groups, *k)``, transposed ``(in, out/groups, *k)``).
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from layerlab.errors import UsageError
from layerlab.shapes import explain, output_shape
from layerlab.shapes.ops import resolve
from tests.shapes.oracle import assert_same_outcome, layerlab_outcome, torch_outcome


def _conv_call(nd, shape, transposed=False, in_channels=None, out_channels=None, kernel_size=3, groups=1, **kw):
    cin = in_channels if in_channels is not None else (shape[-nd - 1] if len(shape) > nd else 1)
    cout = out_channels if out_channels is not None else cin
    g = groups if groups > 0 else 1  # a weight exists for any groups; torch then judges groups itself
    k = kernel_size if isinstance(kernel_size, tuple) else (kernel_size,) * nd
    w = (cin, cout // g) + k if transposed else (cout, cin // g) + k
    fn = getattr(F, f"conv_transpose{nd}d" if transposed else f"conv{nd}d")
    return lambda: fn(torch.zeros(shape), torch.zeros(w), groups=groups, **kw)


# (nd, input shape, params) — including cases where module and functional disagree
CONV = [
    (2, (1, 4, 8, 8), dict(kernel_size=3)),
    (2, (1, 4, 8, 8), dict(kernel_size=3, groups=0)),                      # module: ValueError
    (2, (1, 4, 8, 8), dict(kernel_size=3, groups=-2)),
    (2, (1, 4, 8, 8), dict(kernel_size=3, stride=2, padding="same")),      # E19: RuntimeError
    (1, (1, 4, 8), dict(kernel_size=4, stride=2, padding="same")),
    (2, (1, 4, 8, 8), dict(kernel_size=3, padding="full")),                 # RuntimeError, other text
    (2, (8, 8), dict(kernel_size=3, padding="full")),                       # the rank comes first
    (2, (8, 8), dict(kernel_size=3, groups=0)),
    (2, (1, 4, 8, 8), dict(kernel_size=3, out_channels=5, groups=2)),       # module: ValueError
    (2, (1, 5, 8, 8), dict(kernel_size=3, out_channels=4, groups=2)),       # module: ValueError
    (2, (1, 4, 8, 8), dict(kernel_size=3, padding="same", stride=(1, 1, 1))),
    (2, (1, 4, 8, 8), dict(kernel_size=3, padding="same", dilation=(1, 1, 1))),
    (2, (1, 4, 8, 8), dict(kernel_size=3, padding="valid", stride=2)),
    (3, (4, 5, 6, 7), dict(kernel_size=2, padding="same")),
    (3, (1, 4, 5, 6, 7), dict(kernel_size=(2, 3, 4), stride=(1, 2, 3), padding=1, dilation=2)),
    (2, (1, 4, 2, 2), dict(kernel_size=3)),
    (1, (1, 4, 8), dict(kernel_size=3, padding=-1)),
    (2, (1, 0, 8, 8), dict(kernel_size=3, in_channels=0, out_channels=4)),
]


@pytest.mark.parametrize("nd,shape,params", CONV, ids=[f"{i}" for i in range(len(CONV))])
def test_functional_conv_matches_torch(nd, shape, params):
    theirs = torch_outcome(_conv_call(nd, shape, **params))
    ours = layerlab_outcome(f"F.conv{nd}d", shape, **params)
    assert_same_outcome(ours, theirs, f"F.conv{nd}d {shape} {params}")


CONV_T = [
    (2, (1, 4, 8, 8), dict(kernel_size=3, stride=2, output_padding=1)),
    (2, (1, 4, 8, 8), dict(kernel_size=3, groups=0)),                       # module: ValueError
    (2, (1, 4, 8, 8), dict(kernel_size=3, padding="same")),                 # TypeError, other text
    (1, (1, 4, 8), dict(kernel_size=3, padding="valid")),
    (2, (1, 5, 8, 8), dict(kernel_size=3, in_channels=5, groups=2)),        # module: ValueError
    (2, (1, 4, 8, 8), dict(kernel_size=3, stride=2, output_padding=2)),
    (1, (1, 4, 8), dict(kernel_size=3, stride=2, output_padding=2)),
    (2, (1, 4, 8, 8), dict(kernel_size=3, stride=1, dilation=3, output_padding=2)),
    (3, (4, 3, 3, 3), dict(kernel_size=2, stride=(1, 2, 3), padding=1)),
    (2, (1, 1, 1, 1), dict(kernel_size=1, padding=2)),
    (2, (1, 4, 8, 8), dict(kernel_size=3, in_channels=3)),
]


@pytest.mark.parametrize("nd,shape,params", CONV_T, ids=[f"{i}" for i in range(len(CONV_T))])
def test_functional_conv_transpose_matches_torch(nd, shape, params):
    theirs = torch_outcome(_conv_call(nd, shape, transposed=True, **params))
    ours = layerlab_outcome(f"F.conv_transpose{nd}d", shape, **params)
    assert_same_outcome(ours, theirs, f"F.conv_transpose{nd}d {shape} {params}")


INTERP = [
    ((1, 4, 8, 8), dict(scale_factor=0)),                 # module: "either size or scale_factor" (ValueError)
    ((1, 4, 8, 8), dict(scale_factor=0.0)),
    ((1, 4, 8, 8), dict(scale_factor=(0, 0))),
    ((1, 4, 8, 8), dict(scale_factor=2)),
    ((1, 4, 100, 100), dict(scale_factor=0.29)),
    ((1, 4, 8, 8), dict(scale_factor=(2, 3), mode="bilinear")),
    ((1, 4, 8, 8), dict(scale_factor=2, antialias=True)),
    ((1, 4, 8, 8), dict(scale_factor=2, mode="bilinear", antialias=True)),
    ((1, 1, 8, 8, 8), dict(scale_factor=2, mode="trilinear", antialias=True)),
    ((1, 4, 8), dict(size=5, mode="linear")),
    ((1, 4, 9, 9), dict(scale_factor=0.1, mode="area")),
    ((1, 4, 8, 8), dict(size=3, scale_factor=2)),
]


@pytest.mark.parametrize("shape,params", INTERP, ids=[f"{i}" for i in range(len(INTERP))])
def test_functional_interpolate_matches_torch(shape, params):
    theirs = torch_outcome(lambda: F.interpolate(torch.zeros(shape), **params))
    ours = layerlab_outcome("F.interpolate", shape, **params)
    assert_same_outcome(ours, theirs, f"F.interpolate {shape} {params}")


def test_module_and_functional_differ_where_torch_does():
    """The same arguments: the module name keeps the constructor's ValueError, F. gets ATen's."""
    with pytest.raises(Exception) as module_err:
        output_shape("nn.Conv2d", (1, 4, 8, 8), kernel_size=3, groups=0)
    with pytest.raises(Exception) as functional_err:
        output_shape("torch.nn.functional.conv2d", (1, 4, 8, 8), kernel_size=3, groups=0)
    assert (module_err.value.torch_exception, module_err.value.torch_message) == \
        ("ValueError", "groups must be a positive integer")
    assert (functional_err.value.torch_exception, functional_err.value.torch_message) == \
        ("RuntimeError", "non-positive groups is not supported")
    # accepted by the functional, refused by the module
    assert output_shape("F.interpolate", (1, 4, 9, 9), scale_factor=0, mode="area") == (1, 4, 0, 0)
    with pytest.raises(Exception, match="size or scale_factor"):
        output_shape("upsample", (1, 4, 9, 9), scale_factor=0, mode="area")


def _pool_fn(op):
    return getattr(F, op)


POOL_CASES = {
    "max_pool1d": [((1, 1, 8), dict(kernel_size=2, padding=2, dilation=3)), ((1, 1, 5), dict(kernel_size=2, ceil_mode=True)),
                   ((10,), dict(kernel_size=2)), ((1, 1, 8), dict(kernel_size=3, return_indices=True, padding=2))],
    "max_pool2d": [((1, 1, 8, 8), dict(kernel_size=2, dilation=3, padding=2)), ((1, 1, 2, 2), dict(kernel_size=3, stride=2)),
                   ((1, 1, 8, 8), dict(kernel_size=0)), ((1, 1, 3, 3), dict(kernel_size=2, stride=2, padding=1, ceil_mode=True))],
    "max_pool3d": [((1, 1, 4, 4, 4), dict(kernel_size=2)), ((1, 4, 4, 4), dict(kernel_size=(1, 2, 3), padding=1))],
    "avg_pool1d": [((1, 1, 8), dict(kernel_size=3, padding=1)), ((8,), dict(kernel_size=2)),
                   ((1, 1, 8), dict(kernel_size=(2, 2)))],
    "avg_pool2d": [((1, 1, 2, 2), dict(kernel_size=3, padding=1)), ((1, 1, 8, 8), dict(kernel_size=2, divisor_override=0))],
    "avg_pool3d": [((1, 1, 2, 2, 2), dict(kernel_size=3, padding=1)), ((1, 1, 3, 4, 4), dict(kernel_size=4, stride=2,
                                                                                            ceil_mode=True))],
    "lp_pool1d": [((1, 1, 8), dict(norm_type=2, kernel_size=3)), ((1, 1, 8), dict(norm_type=2, kernel_size=(3,)))],
    "lp_pool2d": [((1, 1, 8, 8), dict(norm_type=1, kernel_size=3, stride=2, ceil_mode=True))],
    "adaptive_avg_pool1d": [((1, 1, 10), dict(output_size=4))],
    "adaptive_avg_pool2d": [((5, 5), dict(output_size=1)), ((1, 1, 0, 5), dict(output_size=(1, 2)))],
    "adaptive_max_pool2d": [((1, 1, 5, 5), dict(output_size=-1)), ((1, 1, 5, 5), dict(output_size=(None, 3)))],
    "adaptive_max_pool3d": [((1, 1, 4, 5, 6), dict(output_size=2))],
    "unfold": [((2, 3, 7, 9), dict(kernel_size=3, padding=1, stride=2)), ((1, 1, 4, 6), dict(kernel_size=5))],
    "fold": [((1, 9, 16), dict(output_size=(6, 6), kernel_size=3)), ((1, 9, 17), dict(output_size=(6, 6), kernel_size=3))],
    "pixel_shuffle": [((2, 1, 8, 3, 3), dict(upscale_factor=2)), ((1, 10, 3, 3), dict(upscale_factor=3))],
    "pixel_unshuffle": [((1, 1, 5, 4), dict(downscale_factor=2))],
    "fractional_max_pool2d": [((1, 2, 9, 9), dict(kernel_size=3, output_ratio=(0.5, 0.5))),
                              ((1, 2, 9, 9), dict(kernel_size=3, output_ratio=0.5)),    # TypeError: len(float)
                              ((1, 2, 9, 9), dict(kernel_size=2, output_size=3, output_ratio=0.5))],
    "fractional_max_pool3d": [((1, 2, 9, 9, 9), dict(kernel_size=2, output_ratio=1.0)),
                              ((1, 2, 9, 9, 9), dict(kernel_size=0, output_size=3))],
}
POOLS = [(op, shape, params) for op, cases in POOL_CASES.items() for shape, params in cases]


def _call(op, shape, params):
    fn = _pool_fn(op)
    args = dict(params)
    if op.startswith("lp_pool"):
        return lambda: fn(torch.zeros(shape), args.pop("norm_type"), **args)
    return lambda: fn(torch.zeros(shape), **args)


@pytest.mark.parametrize("op,shape,params", POOLS, ids=[f"{o}-{i}" for i, (o, _, _) in enumerate(POOLS)])
def test_other_functionals_match_torch(op, shape, params):
    theirs = torch_outcome(_call(op, shape, params))
    ours = layerlab_outcome(f"F.{op}", shape, **params)
    assert_same_outcome(ours, theirs, f"F.{op} {shape} {params}")


def test_functional_call_and_op_name_say_functional():
    ex = explain("F.conv2d", (1, 3, 8, 8), kernel_size=3, stride=2)
    assert ex.op == "F.conv2d" and ex.call == "F.conv2d(kernel_size=3, stride=2)"
    assert resolve("torch.nn.functional.interpolate").functional
    assert not resolve("nn.Conv2d").functional and not resolve("conv2d").functional


@pytest.mark.parametrize("op,param", [("F.conv2d", "padding_mode"), ("F.conv_transpose2d", "output_size")])
def test_module_only_arguments_are_refused_for_functionals(op, param):
    with pytest.raises(UsageError, match=f"no argument '{param}'"):
        explain(op, (1, 1, 8, 8), kernel_size=3, **{param: "zeros" if param == "padding_mode" else (9, 9)})


@pytest.mark.parametrize("op", ["F.patch_embed", "F.ReflectionPad2d", "F.flatten"])
def test_functionals_torch_lacks_are_a_usage_error(op):
    with pytest.raises(UsageError, match="torch.nn.functional has no"):
        resolve(op)


def test_grid_of_conv_cases_agrees_with_torch():
    """A small grid over padding (ints and strings), stride and groups, both names, both APIs."""
    seen = 0
    for padding, stride, groups in itertools.product((0, 1, "same", "valid", "full"), (1, 2), (0, 1, 2, 3)):
        params = dict(kernel_size=3, padding=padding, stride=stride, groups=groups, out_channels=4)
        theirs = torch_outcome(_conv_call(2, (1, 4, 6, 6), **params))
        assert_same_outcome(layerlab_outcome("F.conv2d", (1, 4, 6, 6), **params), theirs, f"F.conv2d {params}")
        seen += 1
    assert seen == 40

"""The no-input table: outputs and lost pixels, checked with torch and autograd."""

import torch

from layerlab.shapes.table import size_table


def _zero_grad_pixels(module, L):
    x = torch.ones(1, 1, L, L, requires_grad=True)
    module(x).sum().backward()
    return int((x.grad[0, 0, 0] == 0).sum())  # one row: the W dim


def test_conv_k3_s2_table_matches_torch():
    table = size_table("conv2d", 2, kernel_size=3, stride=2)
    assert table.formula
    conv = torch.nn.Conv2d(1, 1, 3, 2)
    torch.nn.init.constant_(conv.weight, 1.0)
    for row in table.rows:
        assert row.output == conv(torch.zeros(1, 1, row.input, row.input)).shape[-1]
        assert row.lost_pixels == _zero_grad_pixels(conv, row.input), row
    by_size = {r.input: r for r in table.rows}
    assert by_size[32].output == 15 and by_size[32].lost_pixels == 1
    assert by_size[33].lost_pixels == 0


def test_pool_table_lost_pixels_match_autograd():
    table = size_table("max_pool2d", 2, kernel_size=2)
    pool = torch.nn.AvgPool2d(2)  # same windows as the max pool, and every read pixel gets gradient
    for row in table.rows:
        assert row.lost_pixels == _zero_grad_pixels(pool, row.input)


def test_table_marks_errors_where_torch_raises():
    table = size_table("conv2d", 2, kernel_size=9)
    small = [r for r in table.rows if r.input < 9]
    assert small and all(r.output is None and "Kernel size can't be greater" in r.error for r in small)


def test_keep_size_hints():
    assert size_table("conv2d", 2, kernel_size=3).keep_size.startswith("stride=1, padding=1")
    assert "padding='same'" in size_table("conv2d", 2, kernel_size=4).keep_size
    assert size_table("max_pool2d", 2, kernel_size=3, dilation=2).keep_size.startswith("none: a dilated pool")

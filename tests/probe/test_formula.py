"""Formula checks: the output size explain-shape predicts from each module's own arguments and its
real input, against what the module returned — torch.nn's layers and layerlab's own."""

import pytest
import torch
import torch.nn as nn

import layerlab
from layerlab.probe.formula import shape_op

CASES = [
    (nn.Conv1d(3, 4, 5, stride=2, padding=1), (2, 3, 31)),
    (nn.Conv2d(3, 8, 3, stride=2, padding=1, dilation=2), (2, 3, 33, 20)),
    (nn.Conv2d(3, 8, 4, padding="same"), (1, 3, 9, 9)),
    (nn.Conv3d(2, 2, (1, 3, 3)), (1, 2, 4, 8, 8)),
    (nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1), (1, 4, 7, 7)),
    (nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True), (1, 2, 10, 10)),
    (nn.AvgPool1d(4, stride=3, ceil_mode=True, count_include_pad=False), (2, 3, 17)),
    (nn.LPPool2d(2, 3), (1, 1, 10, 10)),
    (nn.AdaptiveAvgPool2d((5, None)), (1, 2, 13, 9)),
    (nn.AdaptiveMaxPool1d(4), (2, 3, 10)),
    (nn.Unfold(kernel_size=3, padding=1, stride=2), (1, 2, 9, 9)),
    (nn.Fold(output_size=(4, 5), kernel_size=2), (1, 8, 12)),
    (nn.Upsample(scale_factor=1.5, mode="nearest"), (1, 1, 7, 7)),
    (nn.PixelShuffle(2), (1, 8, 3, 3)),
    (nn.PixelUnshuffle(2), (1, 2, 6, 6)),
    (nn.Flatten(1, 2), (2, 3, 4, 5)),
]


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
@pytest.mark.parametrize("module, shape", CASES, ids=[type(m).__name__ for m, _ in CASES])
def test_torch_modules_are_checked_and_pass(module, shape):
    report = layerlab.inspect(module, torch.randn(*shape), backward=False)
    assert len(report.checks) == 1
    check = report.checks[0]
    assert check.passed is True, check
    assert check.predicted == check.actual == list(module(torch.randn(*shape)).shape)
    assert check.input_shape == list(shape)
    assert report.ok


def test_steps_show_the_numbers_substituted():
    report = layerlab.inspect(nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.randn(2, 3, 32, 32))
    check = report.checks[0]
    assert check.op == "conv2d" and check.path == ""
    assert check.steps == ["H: (32 + 2·1 − 3) // 2 + 1 = 16", "W: (32 + 2·1 − 3) // 2 + 1 = 16"]
    assert check.formula_call.startswith("nn.Conv2d(")


def test_only_shape_layers_are_checked_and_each_call_once():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Linear(3, 3))
    report = layerlab.inspect(model, torch.randn(1, 1, 8, 8))
    assert [c.path for c in report.checks] == ["0", "2"]
    assert all(c.passed for c in report.checks)


def test_transposed_conv_output_size_argument():
    up = nn.ConvTranspose2d(2, 2, 3, stride=2)
    report = layerlab.inspect(up, torch.randn(1, 2, 5, 5), output_size=[12, 12])
    check = report.checks[0]
    assert check.actual == [1, 2, 12, 12]
    assert check.passed is True, check


def test_layerlab_layers_declare_their_own_op():
    from layerlab import registry

    entry = registry.find("patch_embedding")
    if entry is None:
        pytest.skip("the patch_embedding reference layer is not registered yet")
    layer = entry.load()(patch_size=4, in_channels=3, embed_dim=16)
    op, params = shape_op(layer)
    assert op == "patch_embed"
    report = layerlab.inspect(layer, torch.randn(2, 3, 16, 16))
    assert report.checks[0].passed is True, report.checks[0]
    assert report.checks[0].actual == [2, 16, 16]


class LiesAboutItsShape(nn.Module):
    """Claims to be a stride-2 conv but keeps the size: the check must fail."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 3, padding=1)

    def layerlab_shape_op(self):
        return "conv2d", {"kernel_size": 3, "stride": 2, "padding": 1}

    def forward(self, x):
        return torch.nn.functional.conv2d(x, self.conv.weight, padding=1)


def test_a_wrong_prediction_is_a_failed_check():
    report = layerlab.inspect(LiesAboutItsShape(), torch.randn(1, 1, 8, 8))
    check = next(c for c in report.checks if c.path == "")
    assert check.passed is False
    assert check.predicted == [1, 1, 4, 4] and check.actual == [1, 1, 8, 8]
    assert "predicted [1, 1, 4, 4], the layer returned [1, 1, 8, 8]" in check.note
    assert report.checks_failed == [check]
    assert not report.ok and report.failure is None


def test_a_call_that_raised_is_not_checked_but_explained_by_the_arithmetic():
    report = layerlab.inspect(nn.Sequential(nn.MaxPool2d(4)), torch.randn(1, 1, 2, 2))
    assert report.failure is not None and report.failure.path == "0"
    check = report.checks[0]
    assert check.predicted is None and check.passed is None  # never counted as passed
    assert check.note.startswith("not checked: the call raised; the arithmetic predicts that")
    assert report.checks_failed == []

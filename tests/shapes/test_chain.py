"""Chains of ops, checked against the same layers run by torch."""

import pytest
import torch

from layerlab.errors import UsageError
from layerlab.shapes.chain import explain_chain, parse_chain


def test_resnet_stem_224_to_56():
    result = explain_chain((1, 3, 224, 224), parse_chain("conv k=7 s=2 p=3 out=64 | maxpool k=3 s=2 p=1"))
    stem = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 7, 2, 3), torch.nn.MaxPool2d(3, 2, 1))
    with torch.no_grad():
        expected = tuple(stem(torch.zeros(1, 3, 224, 224)).shape)
    assert result.ok
    assert result.output_shape == expected == (1, 64, 56, 56)
    assert [ex.input_shape for ex in result.stages] == [(1, 3, 224, 224), (1, 64, 112, 112)]


def test_chain_with_arrows_flags_and_tuples():
    stages = parse_chain("conv2d k=3x5 p=1x2 -> max_pool2d k=2 ceil -> adaptive_avg_pool o=1 -> flatten")
    assert stages[0].params == {"kernel_size": (3, 5), "padding": (1, 2)}
    assert stages[1].params == {"kernel_size": 2, "ceil_mode": True}
    result = explain_chain((2, 4, 15, 15), stages)
    net = torch.nn.Sequential(torch.nn.Conv2d(4, 4, (3, 5), padding=(1, 2)), torch.nn.MaxPool2d(2, ceil_mode=True),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
    assert result.output_shape == tuple(net(torch.zeros(2, 4, 15, 15)).shape) == (2, 4)


def test_chain_stops_at_the_stage_torch_rejects():
    result = explain_chain((1, 3, 8, 8), parse_chain("conv k=3 s=2 | conv k=5 | maxpool k=2"))
    assert not result.ok
    assert len(result.stages) == 2
    assert result.stages[1].error.torch_message.startswith("Calculated padded input size per channel: (3 x 3)")
    with pytest.raises(RuntimeError, match=r"Calculated padded input size per channel: \(3 x 3\)"):
        torch.nn.Sequential(torch.nn.Conv2d(3, 3, 3, 2), torch.nn.Conv2d(3, 3, 5))(torch.zeros(1, 3, 8, 8))


@pytest.mark.parametrize("text, match", [
    ("conv k3", "expected key=value"),
    ("", "--chain is empty"),
    ("conv k=abc3x", "cannot read the value"),
])
def test_chain_syntax_errors(text, match):
    with pytest.raises(UsageError, match=match):
        parse_chain(text)


def test_unknown_op_in_chain():
    with pytest.raises(UsageError, match="unknown op 'convv'"):
        explain_chain((1, 1, 8, 8), parse_chain("convv k=3"))

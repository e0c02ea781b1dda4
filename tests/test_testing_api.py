"""layerlab.testing: assertions a user's own test suite calls, with the report as the message.

Checked on layerlab's registry layers against their torch.nn references (every layer with a
reference passes), on planted bugs (each raises AssertionError naming the failing check), and on
torch.nn layers for the shape and export assertions.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from layerlab import registry
from layerlab.testing import assert_exports, assert_shapes, assert_verified
from tests.checks import planted_bugs
from tests.registry_inputs import build

#: registry layers whose output is their reference's in another layout
REFERENCE_OUTPUT = {"patch_embedding": "flatten(2).transpose(1, 2)"}
WITH_REFERENCE = [n for n in registry.names() if registry.get(n).reference]


def _reference(name: str, module):
    entry = registry.get(name)
    if hasattr(module, "to_torch"):
        return module.to_torch()  # the torch.nn counterpart with the same weights
    return entry.load_reference()()  # weightless (the attention function's wrapper)


@pytest.mark.parametrize("name", WITH_REFERENCE)
def test_every_registry_layer_with_a_reference_passes_assert_verified(name):
    module, args, kwargs = build(name)
    module.train()  # as gradcheck runs a registry layer
    report = assert_verified(module, *args, reference=_reference(name, module), forward_kwargs=kwargs or None,
                             tags=registry.get(name).tags, reference_output=REFERENCE_OUTPUT.get(name))
    assert report.ok
    assert report.check("forward_parity").status == "pass"  # compared, not skipped


@pytest.mark.parametrize("planted, check", [
    (planted_bugs.transposed_linear, "forward_parity"),
    (planted_bugs.swapped_gate_lstm, "forward_parity"),
    (planted_bugs.dropped_factor_function, "gradcheck"),  # no reference: the numerical gradient catches it
])
def test_a_planted_bug_raises_assertion_error_naming_the_check(planted, check):
    layer, args, kwargs = planted()
    with pytest.raises(AssertionError) as info:
        assert_verified(layer, *args, **kwargs)
    message = str(info.value)
    headline = message.splitlines()[0]
    assert headline.startswith("layerlab.verify: ") and check in headline
    report = "\n".join(message.splitlines()[1:])  # the rendered report follows the headline
    assert check in report and "✗ fail" in report and "FAILED" in report
    assert max(len(line) for line in message.splitlines()[1:]) <= 100


def test_assert_shapes_checks_outputs_and_formulas_on_torch_layers():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.MaxPool2d(2, ceil_mode=True), nn.Flatten())
    x = torch.randn(2, 3, 32, 32)
    report = assert_shapes(model, x, expected=(2, 8 * 8 * 8))  # 32 → 15 → ceil(15/2) = 8
    assert [c.passed for c in report.checks] == [True, True, True]
    with pytest.raises(AssertionError, match=r"output shape\(s\) \(2, 512\), expected \(2, 511\)"):
        assert_shapes(model, x, expected=(2, 511))


def test_assert_shapes_reports_a_forward_that_raises_with_the_blamed_layer():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(100, 10))
    with pytest.raises(AssertionError) as info:
        assert_shapes(model, torch.randn(2, 3, 8, 8))
    message = str(info.value)
    assert message.startswith("layerlab.inspect: the forward raised in 2")
    assert "mat1 and mat2 shapes cannot be multiplied (2x288 and 100x10)" in message


def test_assert_shapes_takes_one_shape_per_output_and_refuses_a_non_shape():
    lstm = nn.LSTM(4, 6, batch_first=True)
    assert_shapes(lstm, torch.randn(3, 5, 4), expected=[(3, 5, 6), (1, 3, 6), (1, 3, 6)])
    with pytest.raises(TypeError, match="expected= takes a shape"):
        assert_shapes(lstm, torch.randn(3, 5, 4), expected="(3, 5, 6)")


def test_assert_exports_passes_conv2d_scripted_and_traced_and_fails_an_unscriptable_layer():
    module, args, _ = build("conv2d")
    report = assert_exports(module, *args, paths=["trace", "script"], strict=True)
    assert [(r.path, str(r.status)) for r in report.paths] == [("trace", "pass"), ("script", "pass")]

    class Unscriptable(nn.Module):
        def forward(self, x):
            return x * len([v for v in x.shape if v > 1])  # a list comprehension over a Size with a filter

    with pytest.raises(AssertionError, match=r"layerlab.export_check: script \(fail\)"):
        assert_exports(Unscriptable(), torch.randn(2, 3), paths=["script"])

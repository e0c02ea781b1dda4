"""A raise in the layer's own op, passed through one of layerlab's modes, is the layer's.

Found on a layer that centres its input in place (``x.sub_(x.mean())``): gradcheck's float32-island
mode was the innermost frame of torch's "a leaf Variable that requires grad is being used in an
in-place operation", and the check said "this is a layerlab bug" instead of blaming the forward.
"""

from __future__ import annotations

import torch
from torch import nn

import layerlab
from layerlab.checks.report import Status


class _CentresInPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        x.sub_(x.mean())  # the line blamed
        return self.fc(x)


def test_gradcheck_blames_the_forward_that_wrote_into_its_input_not_layerlab():
    torch.manual_seed(0)
    report = layerlab.gradcheck(_CentresInPlace().double(), torch.randn(3, 6, dtype=torch.float64))
    result = report.check("gradcheck")
    assert result.status == Status.FAIL, (result.status, result.summary)
    assert "in-place operation" in result.summary and "layerlab bug" not in (result.hint or "")
    assert result.where.startswith("test_raised_through_modes.py:") and "(forward)" in result.where
    runs = report.check("runs")
    assert "modified in place" in runs.summary


def test_a_raise_inside_layerlab_itself_is_still_layerlabs():
    from layerlab.checks.run import check_raised

    import layerlab.checks.run as run_module

    code = compile("def f():\n    raise ValueError('boom')\n", run_module.__file__, "exec")
    scope: dict = {}
    exec(code, scope)
    try:
        scope["f"]()
    except ValueError as exc:
        result = check_raised("x", exc)
    assert result.status == Status.WARN and "layerlab bug" in result.hint

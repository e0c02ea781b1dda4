"""Conv with a non-zero padding_mode but no padding: F.pad runs and adds nothing (shape_rules.md §1.6).

The explanation must still show the per-dim arithmetic (one step per spatial dim, agreeing with
the shape torch returns) and must not describe a padding step that pads nothing.
"""

from __future__ import annotations

import pytest
import torch

from layerlab.shapes import explain
from tests.shapes.oracle import torch_outcome

MODES = ["reflect", "replicate", "circular"]


def torch_shape(nd: int, shape, **kw):
    c = shape[1]
    outcome = torch_outcome(lambda: getattr(torch.nn, f"Conv{nd}d")(c, c, **kw)(torch.zeros(shape)))
    assert not outcome.raised, outcome
    return outcome.shape


def padding_notes(ex):
    return [n.message for n in ex.notes if "padding_mode" in n.message]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("nd, shape, padding", [
    (1, (1, 1, 40), 0), (1, (1, 1, 40), (0,)), (1, (1, 1, 40), (0, 0)), (1, (1, 2, 40), "valid"),
    (2, (1, 1, 9, 7), 0), (2, (1, 1, 9, 7), (0, 0)), (3, (1, 1, 4, 5, 6), 0),
])
def test_zero_padding_has_steps_and_no_padding_step(mode, nd, shape, padding):
    kw = dict(kernel_size=3, padding=padding, padding_mode=mode)
    expected = torch_shape(nd, shape, **kw)
    ex = explain(f"conv{nd}d", shape, **kw)
    assert ex.output_shape == expected
    assert [s.output for s in ex.steps] == list(expected[-nd:])
    assert all(s.values.get("p", 0) == 0 and "padding_mode" not in s.values for s in ex.steps)
    notes = padding_notes(ex)
    assert notes == [f"padding_mode={mode!r} changes nothing here: the padding is 0"], notes
    assert not any("F.pad adds" in n.message for n in ex.notes)


def test_hypothesis_found_case_conv1d_reflect_padding_0_0():
    """Conv1d(padding=(0, 0), padding_mode='reflect'): F.pad gets 4 zeros (it pads C too) — the
    L step was missing before."""
    kw = dict(kernel_size=1, padding=(0, 0), padding_mode="reflect")
    ex = explain("conv1d", (1, 1, 40), **kw)
    assert [s.output for s in ex.steps] == [torch_shape(1, (1, 1, 40), **kw)[-1]] == [40]


@pytest.mark.parametrize("mode", MODES)
def test_real_padding_keeps_its_padding_step(mode):
    kw = dict(kernel_size=3, padding=1, padding_mode=mode)
    expected = torch_shape(1, (1, 1, 40), **kw)
    ex = explain("conv1d", (1, 1, 40), **kw)
    assert [s.output for s in ex.steps] == list(expected[-1:]) == [40]
    assert ex.steps[0].values["padding_mode"] == mode and ex.steps[0].values["p"] == 1
    assert padding_notes(ex) == [f"padding_mode={mode!r}: F.pad adds the padding ({mode}) first, then the conv "
                                 "runs with padding 0; input [1, 1, 40] → [1, 1, 42]"]


def test_padding_on_one_dim_only_marks_only_that_step():
    kw = dict(kernel_size=3, padding=(0, 2), padding_mode="reflect")
    expected = torch_shape(2, (1, 1, 9, 7), **kw)
    ex = explain("conv2d", (1, 1, 9, 7), **kw)
    assert [s.output for s in ex.steps] == list(expected[-2:]) == [7, 9]
    assert ["padding_mode" in s.values for s in ex.steps] == [False, True]

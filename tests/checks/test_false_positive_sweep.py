"""No false alarms on torch's own modules: ``verify`` over 80 stock configurations, train and eval,
with and without a reference (a second instance of the same torch class, carrying the weights).

Each is correct by construction, so the assertion is simple and strict: no check fails. A check
may skip or warn, with its reason.
"""

from __future__ import annotations

import copy

import pytest
import torch

import layerlab
from tests.checks.stock_configs import ENTRIES


def _fails(module, inputs, kwargs, verify_kwargs, reference=None):
    report = layerlab.verify(module, *inputs, reference=reference, **verify_kwargs, **kwargs)
    return [f"{c.name}: {c.summary} (where={c.where}; hint={c.hint})" for c in report.checks if c.failed]


def test_the_corpus_is_large_and_runs():
    assert len(ENTRIES) >= 60
    for id_, build, inputs, kwargs, _ in ENTRIES:
        build()(*inputs(), **kwargs)  # each entry is a valid torch call


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("entry", ENTRIES, ids=[e[0] for e in ENTRIES])
def test_no_false_failure(entry, mode):
    id_, build, inputs, kwargs, verify_kwargs = entry
    torch.manual_seed(0)
    module = build().train(mode == "train")
    assert _fails(module, inputs(), kwargs, verify_kwargs) == []


@pytest.mark.parametrize("entry", ENTRIES, ids=[e[0] for e in ENTRIES])
def test_no_false_failure_against_itself(entry):
    """The module against a second instance of its own class (different random init: the weights are
    copied in by the checks): parity must hold exactly."""
    id_, build, inputs, kwargs, verify_kwargs = entry
    torch.manual_seed(0)
    module = build()
    torch.manual_seed(1)
    reference = build()
    assert _fails(module, inputs(), kwargs, verify_kwargs, reference=reference) == []

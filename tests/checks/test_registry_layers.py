"""Acceptance: every registry layer passes ``layerlab gradcheck NAME`` against its reference."""

import pytest

from layerlab import registry
from layerlab.checks.report import Status
from layerlab.checks.targets import verify_entry


@pytest.mark.parametrize("name", registry.names())
def test_registry_layer_passes(name):
    report = verify_entry(name)
    failures = [(c.name, c.where, c.summary) for c in report.failures]
    assert report.ok, failures
    assert report.check("runs").status == Status.PASS
    if registry.get(name).reference is not None:
        assert report.check("forward_parity").status == Status.PASS, report.check("forward_parity").summary
        assert report.check("backward_parity").status == Status.PASS
    if "causal" in registry.get(name).tags:
        assert report.check("causality").status == Status.PASS
    if "recurrent" in registry.get(name).tags:
        assert report.check("recurrent_state").status == Status.PASS

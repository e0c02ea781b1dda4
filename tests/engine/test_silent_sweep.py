"""No silent-bug finding on any correct model of the project's stock sweeps (a finding is a false alarm).

The models: see :mod:`tests.engine.silent_sweep` (Hugging Face architectures, torch.nn stock
configurations and ``module_db`` samples, the benchmark models, every ``configs/*.yaml`` that is not
broken on purpose)."""

import pytest

from tests.engine.silent_sweep import config_entries, silent_of, sweep


@pytest.mark.slow
def test_no_silent_finding_on_the_example_specs():
    found = {}
    for name, build in config_entries():
        model, args, kwargs = build()
        hits = silent_of(model, args, kwargs)
        if hits:
            found[name] = hits
    assert found == {}


@pytest.mark.slow
def test_no_silent_finding_on_any_stock_model():
    total, found = sweep(module_db=True)
    assert total >= 250  # the sweep ran (more with transformers and expecttest installed)
    assert found == {}

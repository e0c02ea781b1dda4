"""Fixtures shared by more than one test package, and the list of slow suites.

The README's test command runs ``-m "not slow"`` (a few minutes on 2 cores); ``.ci/run`` runs the
slow tests as well. A test is slow by its own ``@pytest.mark.slow``, or because its whole file is
one of the long sweeps and corpora named in :data:`SLOW_SUITES` (one list, so a suite's cost is
decided in one place).
"""

from pathlib import Path

import pytest

#: Whole files that are long sweeps or corpora (hostile-input fuzz over every command, stock-model
#: sweeps): every test in them is marked ``slow``. Paths relative to tests/.
SLOW_SUITES = frozenset({
    "hostile/test_new_commands.py",
    "hostile/test_hostile_specs.py",
    "hostile/test_fuzz_cli.py",
    # many subprocess or whole-command runs each (measured ≥ 6 s a file on 2 cores)
    "cli/test_export_cli.py", "cli/test_inspect_meta_cli.py", "cli/test_ddp_cli.py", "cli/test_inspect_cli.py",
    "cli/test_run_faults_cli.py", "cli/test_error_boundary.py", "checks/test_audit_round2.py",
    "spec/test_dynamo_stub.py", "spec/test_spec_meta.py", "distributed/test_ddp_review.py",
    "distributed/test_ddp_check.py", "profiling/test_profile.py", "export/test_audit_round2.py",
    # sweeps over stock models
    "checks/test_module_db.py", "checks/test_false_positive_sweep.py", "hf/test_architecture_sweep.py",
})

_TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        try:
            where = Path(str(item.fspath)).resolve().relative_to(_TESTS).as_posix()
        except ValueError:
            continue
        if where in SLOW_SUITES:
            item.add_marker(pytest.mark.slow)

# The oracle's assert helpers keep pytest's detailed failure messages.
pytest.register_assert_rewrite("tests.shapes.oracle")


@pytest.fixture
def one_thread():
    """One torch intra-op thread during the test (the count before is restored after)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)

"""``inspect`` and ``verify`` over the samples torch tests its own modules with (``module_db``).

Bounded: three samples per module (first, middle, last of torch's list), train and eval. Every
module is torch's own, so a crash of layerlab or a failed check is a false alarm; verdicts that
are true by design of a sample (NaN from a fractional power of negative input, a loss whose every
target is ignored) must come out as warnings or skips that say so, not as failures. The full
sweep runs as ``python -m tests.checks.module_db_sweep``.
"""

from __future__ import annotations

import pytest

pytest.importorskip("expecttest", reason="torch's module_db needs the expecttest package ([test] extra)")

from tests.checks.module_db_sweep import sweep  # noqa: E402


def test_module_db_sweep_has_no_false_alarm():
    result = sweep(per_module=3)
    assert result.samples >= 300
    assert [f"{f.sample} {f.tool}:{f.what} {f.detail}" for f in result.findings] == []

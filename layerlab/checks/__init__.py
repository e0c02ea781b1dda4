"""Verification checks: one module per family, each check a function ``(case, opts) -> CheckResult``.

:mod:`layerlab.checks.run` runs them (``layerlab.verify``); :mod:`layerlab.checks.report` holds
the result objects; :mod:`layerlab.checks.case` the thing verified and the shared tensor helpers.
"""

"""Golden output of the gradcheck renderers (fixed width, no colour, trailing spaces stripped)."""

import io

from rich.console import Console

from layerlab.checks.report import CheckResult, MatrixReport, Status, VerifyReport
from layerlab.cli import render_gradcheck as R

REPORT = """\
gradcheck toy  tests.Toy vs torch.nn.Linear
inputs: input float32[2, 2]  mode: train  seed 0  weights copied by name
check            result  what was compared / found           where
runs             ✓ pass  runs: output (2, 2)
backward_parity  ✗ fail  gradients differ for weight         weight
causality        · skip  the layer does not claim causality

✗ backward_parity  at weight
    grad weight: 3/4 (75.0%) mismatched; greatest abs diff 0.5 at [1, 0] (1 vs 0.5),
    greatest rel diff 2 at [0, 1]; rtol 1e-07, atol 1e-07
    fix: check how weight enters the formula
FAILED: 1 failed, 1 passed, 0 warning(s), 1 skipped  (0.25 s)
"""

MATRIX = """\
layer run bwd caus
toy    ✓   ✗   ·
✓ pass  ✗ fail  ! warning  · skipped (does not apply)
run runs  bwd backward_parity  caus causality
✗ toy · backward_parity at weight: gradients differ for weight
FAILED: 1 layer, 1 failed  (1.5 s)
"""


def _sample() -> VerifyReport:
    cmp = {"what": "grad weight", "ok": False, "shape": [2, 2], "expected_shape": [2, 2], "dtype": "float64",
           "rtol": 1e-7, "atol": 1e-7, "total": 4, "mismatched": 3, "mismatched_pct": 75.0, "max_abs_diff": 0.5,
           "max_abs_index": [1, 0], "max_rel_diff": 2.0, "max_rel_index": [0, 1], "actual_at_max": 1.0,
           "expected_at_max": 0.5, "note": None}
    return VerifyReport(
        target="toy", module="tests.Toy", reference="torch.nn.Linear",
        checks=[CheckResult("runs", Status.PASS, "runs: output (2, 2)"),
                CheckResult("backward_parity", Status.FAIL, "gradients differ for weight", where="weight",
                            hint="check how weight enters the formula", details={"comparisons": [cmp]}),
                CheckResult("causality", Status.SKIP, "the layer does not claim causality")],
        settings={"seed": 0, "mode": "train", "inputs": {"input": "float32[2, 2]"},
                  "reference_weights": "weights copied by name"},
        seconds=0.25)


def _render(parts, width=90) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, highlight=False)
    for part in parts:
        console.print(part)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


def test_report_golden():
    assert _render(R.report(_sample())) == REPORT


def test_matrix_golden():
    matrix = MatrixReport([_sample()], ["runs", "backward_parity", "causality"], seconds=1.5)
    assert _render(R.matrix(matrix)) == MATRIX

"""The broken-model corpus is what it claims to be, under plain torch (no layerlab involved).

Every broken model raises (in its forward, or in its loss), every hand-fixed twin runs forward and
backward, broken and twin share their parameter names, and where the shapes agree too the twin's
state_dict loads into the broken model. If one of these fails, the corpus grades nothing.
"""

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from tests.corpora.broken_models.cases import CASES

IDS = [case.name for case in CASES]
FOLDER = Path(__file__).resolve().parents[1] / "corpora" / "broken_models"


def _run(model, inputs, loss, targets):
    torch.manual_seed(0)
    out = model(*inputs)
    if loss is not None:
        out = loss(out, *targets)
    return out


def _scalar(out):
    if isinstance(out, (tuple, list)):
        return sum(_scalar(o) for o in out)
    return out.float().sum()


def test_the_corpus_is_large_enough_and_names_are_unique():
    assert len(CASES) >= 30
    assert len(set(IDS)) == len(IDS)
    assert sum(case.near_miss for case in CASES) >= 6


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_broken_model_raises(case):
    torch.manual_seed(0)
    twin, broken = case.build_twin(), case.build_broken()
    if case.shares_weights:
        broken.load_state_dict(twin.state_dict())
    targets = case.make_targets() if case.make_targets else ()
    with pytest.raises((RuntimeError, ValueError, IndexError, TypeError)):
        _run(broken, case.make_inputs(), case.loss_broken, targets)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_twin_runs_forward_and_backward(case):
    torch.manual_seed(0)
    twin = case.build_twin()
    inputs = (case.make_twin_inputs or case.make_inputs)()
    targets = case.make_targets() if case.make_targets else ()
    out = _run(twin, inputs, case.loss_twin, targets)
    _scalar(out).backward()
    grads = [p.grad for p in twin.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_broken_and_twin_share_parameter_names(case):
    twin, broken = case.build_twin(), case.build_broken()
    assert set(dict(twin.named_parameters())) == set(dict(broken.named_parameters()))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_wrong_line_is_marked_where_the_fix_is_a_line(case):
    marks = [line for path in FOLDER.glob("models_*.py") for line in path.read_text().splitlines()
             if re.search(r"#\s*(BUG|ALSO)\(%s\)" % re.escape(case.name), line)]
    if case.fix_at_line:
        assert marks, "fix_at_line needs a # BUG(%s) marker" % case.name


def test_the_grader_grades_a_case_and_writes_its_json(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("broken_models_grade", FOLDER / "grade.py")
    grade = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(grade)
    out = tmp_path / "grade.json"
    assert grade.main(["--case", "nerf_posenc_in_features", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["n"] == 1
    record = data["cases"][0]
    assert record["case"] == "nerf_posenc_in_features"
    for key in ("located", "first_fix_right", "dangerous", "false_verified", "no_diagnosis"):
        assert isinstance(record[key], bool)
    assert "totals (of 1)" in capsys.readouterr().out

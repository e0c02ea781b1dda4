"""layerlab diff refuses a report whose numbers are not numbers or whose kind is not a string (exit 2,
where / expected / got), instead of comparing "abc" with "abc" as equal text and saying "no differences"."""

import copy
import json

import pytest
import torch

import layerlab
from layerlab.report_diff.load import ReportError
from layerlab.serialize import to_jsonable


@pytest.fixture(scope="module")
def reports():
    torch.manual_seed(0)
    model, x = torch.nn.Linear(3, 2), torch.randn(2, 3)
    inspect = json.loads(json.dumps(to_jsonable(layerlab.inspect(model, x))))
    profile = json.loads(json.dumps(to_jsonable(layerlab.profile(model, x, repeats=2, warmup=0))))
    return inspect, profile


@pytest.mark.parametrize("edit, where", [
    (lambda r: r["calls"][0]["outputs"][0]["stats"].update(mean="abc"), "calls[0].outputs[0].stats.mean"),
    (lambda r: r["params"][0].update(grad_norm=[1]), "params[0].grad_norm"),
    (lambda r: r["backward"].update(loss_value="0.5"), "backward.loss_value"),
    (lambda r: r.update(kind=42), "kind"),
])
def test_a_malformed_inspect_report_is_refused(reports, edit, where):
    good = reports[0]
    bad = copy.deepcopy(good)
    edit(bad)
    with pytest.raises(ReportError) as info:
        layerlab.diff(good, bad)
    assert info.value.where == f"B: {where}" and info.value.exit_code == 2
    assert info.value.got is not None and info.value.expected


def test_a_malformed_profile_row_is_refused(reports):
    good = reports[1]
    bad = copy.deepcopy(good)
    bad["rows"][0]["flops_forward"] = "many"
    with pytest.raises(ReportError, match=r"rows\[0\]\.flops_forward should be a number"):
        layerlab.diff(bad, good)


def test_non_finite_numbers_as_reports_write_them_are_accepted(reports):
    a = copy.deepcopy(reports[0])
    b = copy.deepcopy(reports[0])
    a["calls"][0]["outputs"][0]["stats"]["max"] = "inf"
    b["calls"][0]["outputs"][0]["stats"]["max"] = "nan"
    assert layerlab.diff(a, a).changes == []
    changed = layerlab.diff(a, b).changes  # compared, not refused
    assert any(c.a == "inf" and c.b == "nan" for c in changed), changed


def test_cli_exit_2_with_where(run_cli, reports, tmp_path):
    good, bad = tmp_path / "a.json", tmp_path / "b.json"
    good.write_text(json.dumps(reports[0]))
    broken = copy.deepcopy(reports[0])
    broken["calls"][0]["outputs"][0]["stats"]["mean"] = "abc"
    bad.write_text(json.dumps(broken))
    code, out, err = run_cli("diff", str(good), str(bad))
    assert code == 2, out + err
    assert "stats.mean" in err and "'abc'" in err


@pytest.fixture
def run_cli(capsys, monkeypatch):
    from layerlab.cli.app import main

    monkeypatch.setenv("COLUMNS", "100")

    def _run(*args):
        code = main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run

"""In-process regression tests for what the hostile corpus of the new commands broke
(:mod:`tests.hostile.corpus_new`): each test pins one fix with the error class, its message and its
``where``, against real torch modules and real reports.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from layerlab.cli.app import main  # noqa: E402
from layerlab.errors import SpecError, UsageError  # noqa: E402

MLP = "block:\n  - Linear: {in_features: 3, out_features: 2}\ninput: {shape: [4, 3]}\n"


def invoke(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def spec(tmp_path, text: str) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return str(path)


# -- train-check ----------------------------------------------------------------------------------

def test_a_module_class_that_needs_arguments_is_not_a_loss():
    from layerlab.train.loss import loss_function

    with pytest.raises(SpecError, match="the loss Linear cannot be built without arguments") as info:
        loss_function(torch.nn.Linear, "s.yaml:5:3")
    assert info.value.where == "s.yaml:5:3"
    assert loss_function(torch.nn.MSELoss, "x")[0] == "MSELoss"  # a loss class still builds


def test_train_loss_given_as_torch_module_path_is_refused_at_its_line(tmp_path):
    code, _, err = invoke("train-check", spec(tmp_path, MLP + "train:\n  loss: torch.nn:Linear\n"))
    assert code == 2, err
    assert "cannot be built without arguments" in err and "s.yaml:5:3" in err and "Traceback" not in err


def test_train_target_written_as_a_word_is_refused_at_its_line(tmp_path):
    code, _, err = invoke("train-check", spec(tmp_path, MLP + "train:\n  target: zeros\n"))
    assert code == 2, err
    assert "train: target is a tensor" in err and "s.yaml:5:3" in err and "Traceback" not in err


def test_a_numeric_literal_target_meets_the_shape_check_not_a_crash(tmp_path):
    code, _, err = invoke("train-check", spec(tmp_path, MLP + "train:\n  target: 0.5\n"), "--json")
    assert code == 2, err
    error = json.loads(err.strip().splitlines()[-1])
    assert error["message"] == "the target's shape [] is not the prediction's [4, 2]"
    assert error["where"].endswith("s.yaml:5:3")


def test_a_target_the_loss_rejects_is_reported_at_the_target_line(tmp_path):
    """torch's cross_entropy raises on a class index beyond the logits; the refusal names the
    spec's target line, not the bare word 'loss'."""
    text = MLP + "train:\n  loss: cross_entropy\n  target: {shape: [4], low: 0, high: 50}\n"
    with pytest.raises(IndexError, match="out of bounds"):  # what torch itself says
        torch.nn.functional.cross_entropy(torch.zeros(4, 2), torch.tensor([0, 1, 43, 2]))
    code, _, err = invoke("train-check", spec(tmp_path, text))
    assert code == 2, err
    assert "rejected the prediction output: IndexError" in err and "s.yaml:6:3" in err


# -- ddp-check ------------------------------------------------------------------------------------

@pytest.mark.parametrize("seconds", [1e300, 86_400.5, 1e15])
def test_ddp_timeout_beyond_a_day_is_refused(seconds):
    from datetime import timedelta

    from layerlab.distributed.options import MAX_TIMEOUT, check_timeout, from_section

    if seconds == 1e300:
        with pytest.raises(OverflowError):  # what torch's timedelta would have raised mid-run
            timedelta(seconds=seconds)
    with pytest.raises(UsageError, match="at most 86400") as info:
        check_timeout(seconds)
    assert info.value.where == "--timeout"
    with pytest.raises(SpecError, match="at most 86400") as info:
        from_section({"timeout": seconds}, lambda *keys: "s.yaml:9:3" if keys == ("ddp", "timeout") else "?")
    assert info.value.where == "s.yaml:9:3"
    assert check_timeout(MAX_TIMEOUT) == MAX_TIMEOUT


# -- inspect --probe, --plot ------------------------------------------------------------------------

def test_an_unknown_probe_name_is_echoed_cut_short():
    from layerlab.probe.probes.spec import from_option

    with pytest.raises(UsageError) as info:
        from_option(["a" * 100_000])
    assert len(info.value.message) < 300 and len(str(info.value.got)) < 200
    assert "more characters" in info.value.message


@pytest.mark.parametrize("value", ["", ",", " , ,"])
def test_probe_option_that_names_no_probe_is_refused(value):
    from layerlab.probe.probes.spec import from_option

    with pytest.raises(UsageError, match="--probe names no probe"):
        from_option([value])
    assert from_option([" , sparsity,"]) == ["sparsity"]  # empty items beside a name are fine
    assert from_option(None) == [] and from_option([]) == []


def test_a_picture_path_too_long_for_the_file_system_is_a_usage_error(tmp_path):
    from layerlab.cli.output import check_writable

    long = tmp_path / ("a" * 5000 + ".svg")
    with pytest.raises(OSError):  # what Path.exists raises on this Python (ENAMETOOLONG)
        long.exists()
    with pytest.raises(UsageError, match="cannot write") as info:
        check_writable(long, "--plot")
    assert info.value.where == "--plot"


# -- diff -------------------------------------------------------------------------------------------

def _inspect_dict(module, *inputs, **kw):
    import layerlab
    from layerlab.serialize import to_jsonable

    return to_jsonable(layerlab.inspect(module, *inputs, **kw))


def test_real_reports_are_well_formed_and_equal_to_themselves():
    """The structure check refuses nothing layerlab writes: an LSTM with probes, a transformer layer
    with formula checks and notes, each compared with itself."""
    import layerlab

    torch.manual_seed(0)
    reports = [
        _inspect_dict(torch.nn.LSTM(3, 4, batch_first=True), torch.randn(2, 5, 3), probes=["steps", "sparsity"]),
        _inspect_dict(torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                      torch.randn(2, 3, 8), probes=["attention", "dead", "rank"]),
    ]
    for report in reports:
        result = layerlab.diff(report, json.loads(json.dumps(report)))
        assert not result.differs, result.changes[:3]
    code, out, err = invoke("profile", "linear", "--json")
    assert code == 0, err
    profile = json.loads(out)
    assert not layerlab.diff(profile, profile).differs


def test_a_report_with_a_call_missing_its_number_is_refused_by_json_path():
    import layerlab
    from layerlab.report_diff.load import ReportError

    good = _inspect_dict(torch.nn.Linear(3, 2), torch.randn(4, 3))
    bad = json.loads(json.dumps(good))
    del bad["calls"][0]["call"]
    with pytest.raises(ReportError, match="not a well-formed inspect report: calls\\[0\\].call") as info:
        layerlab.diff(bad, good)
    assert info.value.where == "A: calls[0].call"
    bad = json.loads(json.dumps(good))
    bad["params"][0]["name"] = ["weight"]  # unhashable: it used to escape as a TypeError
    with pytest.raises(ReportError, match="params\\[0\\].name"):
        layerlab.diff(good, bad)


@pytest.mark.parametrize("text,match", [
    ("[" * 100_000 + "]" * 100_000, "too deep to read"),
    ('{"schema": 1, "v": ' + "[" * 500 + "]" * 500 + "}", "more than 64 deep"),
    ('{"schema": 1, "v": ' + "9" * 5000 + "}", "not a JSON report layerlab can read"),
])
def test_json_that_only_python_chokes_on_is_a_report_error(tmp_path, text, match):
    import layerlab
    from layerlab.report_diff.load import ReportError

    path = tmp_path / "a.json"
    path.write_text(text)
    with pytest.raises(ReportError, match=match) as info:
        layerlab.diff(str(path), str(path))
    assert info.value.where == str(path)


def test_a_report_file_beyond_the_size_limit_is_refused_before_reading(tmp_path):
    import layerlab
    from layerlab.report_diff.load import MAX_BYTES, ReportError

    path = tmp_path / "huge.json"
    with open(path, "wb") as f:  # sparse: no disk used
        f.truncate(MAX_BYTES + 1)
    with pytest.raises(ReportError, match="larger than any layerlab report"):
        layerlab.diff(str(path), str(path))


def test_strings_from_a_report_are_echoed_escaped_and_cut():
    import layerlab

    good = _inspect_dict(torch.nn.Linear(3, 2), torch.randn(4, 3))
    bad = json.loads(json.dumps(good))
    bad["calls"][0]["path"] = "\x1b]0;owned\x07" + "p" * 1_000_000
    bad["calls"][0]["class_name"] = "\x9b31mLinear"
    result = layerlab.diff(good, bad)
    assert result.differs
    for change in result.changes:
        for text in (change.where, change.a, change.b):
            if isinstance(text, str):
                assert len(text) < 400 and "\x1b" not in text and "\x9b" not in text and "\x07" not in text

"""export-check on real layers whose fate under each path is known (torch 2.x, CPU, no mocks)."""

import pytest
import torch
from torch import nn

from layerlab.checks.report import Status
from layerlab.deploy.run import export_check
from tests.export.modules import BatchReshape, LengthScale, PoolWithIndices, SignBranch

HAS_ORT = all(__import__("importlib").util.find_spec(m) for m in ("onnx", "onnxruntime"))


def _where(fn, text):
    """``tests/export/modules.py:N`` of the line of ``fn`` that contains ``text``."""
    import inspect

    lines, start = inspect.getsourcelines(fn)
    return f"tests/export/modules.py:{start + next(i for i, ln in enumerate(lines) if text in ln)}"


BRANCH = _where(SignBranch.forward, "if x.sum() > 0")


def _cells(report):
    return {p.path: p for p in report.paths}


pytestmark = pytest.mark.usefixtures("one_thread")


def test_data_dependent_branch():
    torch.manual_seed(0)
    cells = _cells(export_check(SignBranch(), torch.randn(2, 4)))
    trace = cells["trace"]
    assert trace.status == Status.WARN, trace.reason  # never a pass: the branch is frozen
    assert trace.where == BRANCH and "TracerWarning" in trace.reason
    assert trace.details["tracer_warnings"][0]["message"].startswith("Converting a tensor to a Python boolean")
    assert cells["script"].status == Status.PASS  # TorchScript compiles the if statement itself
    compile_ = cells["compile"]
    assert compile_.status == Status.WARN and "Data-dependent branching" in compile_.reason
    assert compile_.details["graph_breaks"] == 1 and compile_.matches_eager is True
    assert compile_.where == BRANCH
    for path in ("export", "export_dynamic"):
        assert cells[path].status == Status.FAIL
        assert "GuardOnDataDependentSymNode" in cells[path].reason
        assert cells[path].where == BRANCH
    if HAS_ORT:
        assert cells["onnx"].status == Status.FAIL


def test_branch_trace_warns_through_the_values_variant_even_without_warnings(recwarn):
    torch.manual_seed(0)
    x = torch.randn(2, 4)
    x = x if x.sum() > 0 else -x  # the trace takes the positive side; negated inputs take the other
    trace = export_check(SignBranch(), x, paths=["trace"]).paths[0]
    problems = trace.details["problems"]
    assert any(p.startswith("at inputs negated") for p in problems), problems


def test_maxpool_with_indices_in_a_traced_model():
    torch.manual_seed(0)
    report = export_check(PoolWithIndices(), torch.randn(2, 3, 8, 8))
    cells = _cells(report)
    for path in ("trace", "script", "compile", "export", "export_dynamic"):
        assert cells[path].status == Status.PASS, (path, cells[path].reason)
        assert cells[path].matches_eager is True
    # the int64 indices are compared too, exactly
    index_cmp = next(c for c in cells["trace"].comparisons if c["what"].startswith("output[1]"))
    assert index_cmp["dtype"] == "int64" and index_cmp["ok"] and index_cmp["total"] == 2 * 4 * 4 * 4
    if HAS_ORT:
        assert cells["onnx"].status == Status.PASS, cells["onnx"].reason


def test_length_baked_silently_into_the_trace_is_a_warning():
    torch.manual_seed(0)
    trace = export_check(LengthScale(), torch.randn(2, 5, 3), paths=["trace"]).paths[0]
    assert trace.status == Status.WARN
    assert trace.reason.startswith("input-specific: at length 5 → 4 output differs"), trace.reason
    assert trace.matches_eager is True  # right on its own example: only another length exposes it


def test_registry_rnn_loop_unrolled_by_the_trace():
    from layerlab.checks.resolve import resolve_entry
    from layerlab.deploy.run import check_target

    report = check_target(resolve_entry("rnn"), paths=["trace", "export_dynamic"])
    trace, dyn = report.paths
    assert trace.status == Status.WARN
    assert "at length 7 → 6 it raises RuntimeError: Expected 7 elements in a list but found 6" in trace.reason
    assert dyn.status == Status.PASS, dyn.reason  # the loop runs over time; the batch dim stays dynamic


def test_batch_size_as_python_int():
    cells = _cells(export_check(BatchReshape(), torch.randn(2, 3, 4), paths=["trace", "export", "export_dynamic"]))
    assert cells["trace"].status == Status.WARN and "batch 3 (was 2)" in cells["trace"].reason
    assert cells["export"].status == Status.PASS
    dyn = cells["export_dynamic"]
    assert dyn.status == Status.WARN
    assert "specialized it to be a constant (2)" in dyn.reason


def test_nn_lstm_through_each_path():
    torch.manual_seed(0)
    report = export_check(nn.LSTM(4, 8, batch_first=True), torch.randn(2, 5, 4))
    cells = _cells(report)
    assert cells["trace"].status == Status.WARN  # rnn.py's input checks become frozen Python bools
    assert cells["trace"].where.startswith("torch/nn/modules/rnn.py:")
    assert "still equals eager" in cells["trace"].reason  # … but the trace does generalise
    assert cells["script"].status == Status.FAIL
    assert "'RecursiveScriptModule' object has no attribute 'forward'" in cells["script"].reason
    assert cells["compile"].status == Status.WARN
    assert "Attempted to wrap RNN, GRU, or LSTM" in cells["compile"].reason
    assert cells["export"].status == Status.PASS and cells["export"].matches_eager
    assert cells["export_dynamic"].status == Status.PASS
    if HAS_ORT:
        assert cells["onnx"].status == Status.PASS, cells["onnx"].reason
        assert cells["onnx"].details["exporter"].startswith(("dynamo", "TorchScript"))
    assert not report.ok  # script failed: exit 1 from the CLI
    assert report.settings["rtol"] == 1e-4 and report.settings["atol"] == 1e-5


def test_inputs_and_module_left_alone():
    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).train()
    x = torch.randn(3, 4)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    export_check(m, x, paths=["trace", "export"])
    assert m.training and all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert not m._forward_hooks


def test_unknown_path_is_a_usage_error():
    from layerlab.errors import UsageError

    with pytest.raises(UsageError, match="no export path called 'tracer'"):
        export_check(nn.Linear(2, 2), torch.randn(1, 2), paths=["tracer"])


def test_eager_failure_fails_every_cell():
    report = export_check(nn.Linear(3, 2), torch.randn(2, 4), paths=["trace", "export"])
    assert [p.status for p in report.paths] == [Status.FAIL, Status.FAIL]
    assert report.paths[0].reason.startswith("eager forward raised RuntimeError")

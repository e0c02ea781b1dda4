"""The silent-shape-bug corpus (tests/corpora/silent_bugs) is sound: every bug is real.

Each buggy model and its twin must run forward and backward, share parameter names (one
state_dict loads into both), and compute different outputs on the same weights and inputs, so a
grade on the corpus measures real bugs. Twins that give one output row per sample must also be
batch-consistent: sample 0 run alone gives the batched run's row 0 (in eval mode, so BatchNorm
uses its running statistics).
"""

import pytest
import torch

from tests.corpora.silent_bugs.cases import CASES

AREAS = {"NLP", "audio", "time series", "vision", "graphs", "recommenders", "RL", "generative"}


def _outputs(model, inputs):
    out = model(*inputs)
    return out if isinstance(out, tuple) else (out,)


def _loaded_pair(case):
    buggy, twin = case.build_buggy(), case.build_twin()
    twin.load_state_dict(buggy.state_dict(), strict=True)
    return buggy, twin


def test_corpus_is_large_and_spread():
    names = [case.name for case in CASES]
    assert len(names) >= 18
    assert len(set(names)) == len(names)
    assert {case.area for case in CASES} == AREAS


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_buggy_line_is_in_the_buggy_source(case):
    file, line = case.buggy_location()
    assert file.endswith("_cases.py") and line > 0
    assert case.op and case.intent


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
@pytest.mark.parametrize("which", ["buggy", "twin"])
def test_runs_forward_and_backward(case, which):
    model = case.build_buggy() if which == "buggy" else case.build_twin()
    outputs = _outputs(model, case.make_inputs())
    loss = sum(out.float().sum() for out in outputs)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_pair_shares_parameter_names(case):
    buggy, twin = case.build_buggy(), case.build_twin()
    assert type(buggy) is not type(twin)
    assert {n: p.shape for n, p in buggy.state_dict().items()} == {n: p.shape for n, p in twin.state_dict().items()}
    assert [n for n, _ in buggy.named_parameters()] == [n for n, _ in twin.named_parameters()]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_buggy_and_twin_outputs_differ_on_the_same_weights(case):
    buggy, twin = _loaded_pair(case)
    inputs = case.make_inputs()
    with torch.no_grad():
        ours, theirs = _outputs(buggy, inputs), _outputs(twin, inputs)
    differs = [a.shape != b.shape or not torch.allclose(a, b, rtol=1e-4, atol=1e-5)
               for a, b in zip(ours, theirs)]
    assert any(differs), f"{case.name}: the buggy model computes what its twin computes"


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_twin_rows_do_not_depend_on_other_samples(case):
    twin = case.build_twin().eval()
    inputs = case.make_inputs()
    batch = inputs[0].shape[0]
    with torch.no_grad():
        full = _outputs(twin, inputs)[0]
        if full.dim() == 0 or full.shape[0] != batch:
            pytest.skip("the twin returns a loss, not one row per sample")
        alone = _outputs(twin, tuple(x[:1] if x.dim() and x.shape[0] == batch else x for x in inputs))[0]
    torch.testing.assert_close(alone, full[:1], rtol=1e-5, atol=1e-6)


def test_grader_needs_the_op_and_the_exact_line():
    from tests.corpora.silent_bugs import grade

    case = next(case for case in CASES if case.name == "nlp_view_for_transpose")
    file, line = case.buggy_location()

    def verdict(*texts):
        findings = [{"code": "x", "severity": "warning", "where": None, "text": t} for t in texts]
        return grade.grade_findings(case, findings, (file, line))["verdict"]

    assert verdict(f"x.view(4, 12, 10) at {file}:{line} interleaves the axes") == "flagged"
    assert verdict(f"x.view(4, 12, 10) at {file}:{line}0") == "partial"        # another line
    assert verdict(f"something at {file}:{line}") == "partial"                  # no op named
    assert verdict("preview of the weights") == "unrelated"                    # 'view' inside a word
    assert verdict() == "missed"

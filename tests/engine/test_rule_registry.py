"""The one registry of diagnosis rules: ids, triggers, order, and what happens when a rule breaks.

Every registered rule must have a unique id, a docstring, its id written once in the package source
(where it is registered: one grep leads from a hint to its rule) and a test that names it — the
table of :mod:`tests.probe.test_rule_ids` runs a real failing model per rule and asserts the id.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

import pytest
import torch
import torch.nn as nn

import layerlab
from layerlab.engine import rule_registry as registry
from layerlab.engine.rule_registry import all_rules, register_rule, rules_for
from layerlab.probe import op_triggers as ops
from layerlab.serialize import to_jsonable

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _source(folder: str) -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / folder).rglob("*.py")))


def test_every_rule_has_an_id_a_docstring_and_is_registered_where_its_id_is_written_once():
    rules = all_rules()
    assert len(rules) >= 60
    ids = [r.id for r in rules]
    assert len(ids) == len(set(ids))
    package = _source("layerlab")
    for rule in rules:
        assert re.fullmatch(r"[a-z0-9-]+/[a-z0-9-]+", rule.id), rule.id
        assert (rule.run.__doc__ or "").strip() and rule.summary, rule.id
        assert package.count(f'"{rule.id}"') == 1, f"{rule.id} must appear once in the source, where it is registered"
        assert rule.stage in registry.STAGES and rule.severity in registry.SEVERITIES


def test_every_rule_is_named_by_a_test():
    tests = "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "tests").rglob("*.py"))
                      if p.name != pathlib.Path(__file__).name)
    missing = [r.id for r in all_rules() if r.id not in tests]
    assert not missing, f"rules no test names: {missing}"


def test_triggers_are_torch_callables_and_module_classes_never_strings():
    for rule in all_rules():
        for trigger in rule.on:
            assert not isinstance(trigger, str), rule.id
            if rule.stage == "op":
                assert callable(trigger) and not isinstance(trigger, type), rule.id
            else:
                assert isinstance(trigger, type) and issubclass(trigger, nn.Module), rule.id


@pytest.fixture
def scratch():
    """Rules registered by a test are removed after it."""
    before = dict(registry._RULES)
    yield
    registry._RULES.clear()
    registry._RULES.update(before)


def test_a_duplicate_id_a_string_trigger_and_a_missing_docstring_are_refused(scratch):
    all_rules()
    with pytest.raises(ValueError, match="registered twice"):
        register_rule("broadcast/sizes", stage="op", order=1)(lambda ctx: None)
    with pytest.raises(TypeError, match="string"):
        register_rule("test/string-trigger", stage="op", on=("add",), order=1)
    with pytest.raises(TypeError, match="module classes"):
        register_rule("test/op-for-module", stage="module", on=(torch.add,), order=1)
    with pytest.raises(ValueError, match="docstring"):
        register_rule("test/no-doc", stage="op", order=1)(lambda ctx: None)
    with pytest.raises(ValueError, match="family/name"):
        register_rule("NoSlash", stage="op", order=1)


def test_an_op_matches_the_rules_of_its_aliases_in_registered_order():
    all_rules()
    for spelling in (torch.add, torch.Tensor.add, torch.Tensor.__add__):
        found = [r.id for r in rules_for("op", op=spelling)]
        assert found.index("batch/reduced-over-batch") < found.index("broadcast/missing-trailing-axes") \
            < found.index("dtype/mixed-operands") < found.index("broadcast/sizes"), found
        assert "join/cat-sizes" not in found and "matmul/inner-dims" not in found
    # `1 / x` is dispatched as Tensor.__rtruediv__, which torch names __rdiv__: a spelling list missed it
    assert "broadcast/sizes" in [r.id for r in rules_for("op", op=torch.Tensor.__rtruediv__)]
    assert ops.matches(torch.concat, ops.JOINS) and not ops.matches(torch.stack, ops.JOINS)


def test_module_rules_follow_the_class_hierarchy():
    all_rules()
    conv = [r.id for r in rules_for("module", module=nn.Conv3d(2, 2, 1))]
    assert conv[:3] == ["input/tuple-return-value", "device/module-input", "dtype/module-input"]
    assert conv.index("layout/video-frames-first") < conv.index("conv/in-channels") \
        < conv.index("shape/layer-arithmetic")
    assert "linear/in-features" not in conv
    assert "conv/in-channels" not in [r.id for r in rules_for("module", module=nn.Linear(2, 2))]


class _Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x)


def _break(monkeypatch, rule_id):
    rule = registry.get_rule(rule_id)

    def boom(ctx):
        raise RuntimeError("this rule cannot read its inputs")

    monkeypatch.setitem(registry._RULES, rule_id, dataclasses.replace(rule, run=boom))


def test_a_rule_that_raises_is_skipped_silently_by_default(monkeypatch, capsys):
    monkeypatch.delenv("LAYERLAB_DEBUG", raising=False)
    _break(monkeypatch, "linear/in-features")
    report = layerlab.inspect(_Wide(), torch.randn(2, 6), backward=False, fix=False)
    d = report.failure.diagnosis
    assert d is None or d.rule_id != "linear/in-features"  # the next rule answers, or none does
    assert "cannot read its inputs" not in capsys.readouterr().err


def test_a_rule_that_raises_is_reported_with_its_traceback_under_layerlab_debug(monkeypatch, capsys):
    monkeypatch.setenv("LAYERLAB_DEBUG", "1")
    _break(monkeypatch, "linear/in-features")
    report = layerlab.inspect(_Wide(), torch.randn(2, 6), backward=False, fix=False)
    assert report.failure is not None  # the failure is still reported: a broken rule is not a crash
    err = capsys.readouterr().err
    assert "rule linear/in-features raised RuntimeError" in err
    assert "Traceback" in err and "cannot read its inputs" in err


def test_the_diagnosis_carries_the_id_and_severity_of_the_rule_that_answered(monkeypatch):
    monkeypatch.delenv("LAYERLAB_DEBUG", raising=False)
    report = layerlab.inspect(_Wide(), torch.randn(2, 6), backward=False, fix=False)
    d = report.failure.diagnosis
    assert d.rule_id == "linear/in-features" and d.severity == "error"
    assert "§" not in (d.rule or "")
    data = to_jsonable(report)["failure"]["diagnosis"]  # what --json writes
    assert data["rule_id"] == "linear/in-features" and data["severity"] == "error"


def test_all_rules_lists_id_trigger_and_summary():
    listed = {r.id: r for r in all_rules()}
    linear = listed["linear/in-features"]
    assert linear.stage == "module" and linear.trigger == "nn.Linear"
    assert linear.summary.startswith("nn.Linear whose input's last dim is not")
    assert listed["batch/reduced-over-batch"].trigger == "every op"
    assert "torch.cat" in listed["join/cat-sizes"].trigger

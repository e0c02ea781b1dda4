"""``layerlab inspect`` shows silent-bug findings: rule id, op and line, evidence and fix, in both
the human view and ``--json``; a warning, so the exit code stays 0."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC = str(ROOT / "configs" / "silent_heads.yaml")


def test_silent_finding_in_the_human_view(run):
    code, out, err = run("inspect", SPEC, "--allow-import", "--no-backward")
    assert code == 0, out + err
    assert "⚠ silent/interleaving-view reshape at configs/silent_layers.py:21" in out
    assert "evidence: axis 2 [6] is x axis 1 (seq)" in out
    assert "hint: did you mean `.transpose(1, 2)` before the reshape?" in out
    assert "OK  (0 errors, 1 warnings)" in out and "Traceback" not in out + err


def test_silent_finding_in_json(run):
    code, out, err = run("inspect", SPEC, "--allow-import", "--no-backward", "--json")
    assert code == 0, out + err
    report = json.loads(out)
    found = [p for p in report["problems"] if p["code"].startswith("silent/")]
    assert len(found) == 1, found
    f = found[0]
    assert f["code"] == "silent/interleaving-view" and f["severity"] == "warning"
    assert f["where"].endswith("silent_layers.py:21") and f["data"]["line"] == f["where"]
    assert f["data"]["op"] == "reshape" and f["data"]["rule"] == f["code"]
    assert "(weights @ v).reshape(N, L, E)" in f["data"]["code"]
    assert any("x axis 1 (seq)" in e for e in f["data"]["evidence"])
    assert "transpose(1, 2)" in f["data"]["fix"] and f["hint"] == f["data"]["fix"]

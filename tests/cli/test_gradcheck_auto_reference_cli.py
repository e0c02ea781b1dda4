"""`layerlab gradcheck` on a user's hand-written layer with no reference named: the auto-reference
(a torch.nn layer the class mirrors) catches the planted bug and says what the error looks like."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "configs" / "user_layernorm.yaml"


def test_unbiased_variance_is_caught_without_a_reference(run):
    code, out, err = run("gradcheck", str(SPEC), "--allow-import", "--json")
    assert code == 1, out + err
    report = json.loads(out)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["forward_parity"]["status"] == "fail" and checks["forward_parity"]["where"] == "output"
    assert "torch.nn.LayerNorm" in report["reference"]
    # the pattern is the real one: torch's LayerNorm over ours is a constant ratio √((N-1)/N)
    x = torch.randn(4, 5, 16, dtype=torch.float64)
    ratio = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + 1e-5)
    ratio = ratio / torch.nn.functional.layer_norm(x, (16,), eps=1e-5)
    assert abs(ratio.mean().item() - (15 / 16) ** 0.5) < 1e-3
    assert "√((N−1)/N) with N=16" in checks["forward_parity"]["summary"]
    assert "unbiased" in checks["forward_parity"]["hint"]


def test_the_fixed_layer_passes_and_the_auto_reference_can_be_turned_off(run, tmp_path):
    for name in ("user_layernorm.yaml", "user_layers.py"):
        shutil.copy(ROOT / "configs" / name, tmp_path / name)
    code_file = tmp_path / "user_layers.py"
    code_file.write_text(code_file.read_text().replace("var = x.var(-1, keepdim=True)",
                                                       "var = x.var(-1, keepdim=True, unbiased=False)"))
    code, out, err = run("gradcheck", str(tmp_path / "user_layernorm.yaml"), "--allow-import", "--json")
    assert code == 0, out + err
    assert json.loads(out)["checks"][1]["status"] == "pass"  # forward_parity, against torch.nn.LayerNorm
    code, out, err = run("gradcheck", str(SPEC), "--allow-import", "--no-auto-reference", "--json")
    assert code == 0, out + err  # without a reference the bug is invisible to the other checks
    assert {c["name"]: c["status"] for c in json.loads(out)["checks"]}["forward_parity"] == "skip"

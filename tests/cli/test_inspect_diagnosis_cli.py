"""inspect's failure report in the terminal and in JSON: counted, not-checked, standing alone; --ops rows."""

import json


def test_a_call_that_raised_is_counted_and_not_checked(run, tmp_path):
    spec = tmp_path / "broken.yaml"
    spec.write_text("block:\n  - Conv2d: {in_channels: 3, out_channels: 4, kernel_size: 3}\n"
                    "  - MaxPool2d: {kernel_size: 8}\ninput: {shape: [1, 3, 6, 6]}\n")
    code, out, err = run("inspect", str(spec))
    assert code == 1, out + err
    assert "1 error (the failure above)" in out
    assert "0 passed, 0 failed" not in out or "not checked" in out
    assert "§" not in out
    assert "(rule upstream/pool-map-too-small)" in out  # the rule that answered, to grep for


def test_json_errors_stand_alone(run, tmp_path):
    spec = tmp_path / "broken.yaml"
    spec.write_text("block:\n  - Embedding: {num_embeddings: 50, embedding_dim: 8}\n"
                    "  - Conv1d: {in_channels: 8, out_channels: 4, kernel_size: 3}\n"
                    "input: {shape: [2, 10], dtype: int64, low: 0, high: 50}\n")
    code, out, err = run("inspect", str(spec), "--json")
    assert code == 1, out + err
    report = json.loads(out)
    d = report["failure"]["diagnosis"]
    assert d["cause"] == "layout" and d["fix"]["code"] == "x.transpose(1, 2)"
    assert d["rule_id"] == "conv/in-channels" and d["severity"] == "error"
    assert d["verified"]["status"] == "runs" and d["verified"]["outputs"] == [[2, 4, 8]]
    error = json.loads(err)
    assert "panel" not in json.dumps(error)
    assert "Conv1d expects C = in_channels = 8" in error["message"]
    assert "x.transpose(1, 2)" in error["hint"] and "verified on a copy" in error["hint"]


def test_ops_flag_nests_ops_under_their_module(run, tmp_path):
    (tmp_path / "attn_model.py").write_text(
        "import torch.nn as nn\n\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = nn.Linear(8, 8)\n\n"
        "    def forward(self, x):\n"
        "        y = self.fc(x).transpose(1, 2)\n"
        "        return y.sum(-1)\n")
    spec = tmp_path / "net.yaml"
    spec.write_text(f"layer: {tmp_path / 'attn_model.py'}:Net\ninput: {{shape: [2, 5, 8]}}\n")
    code, out, err = run("inspect", str(spec), "--ops", "--allow-import")
    assert code == 0, out + err
    lines = out.splitlines()
    fc = next(i for i, line in enumerate(lines) if " fc Linear" in line)
    assert "· transpose(1, 2)" in lines[fc + 1] and "(2, 8, 5)" in lines[fc + 1]
    assert "· y.sum(-1)" in lines[fc + 2]
    assert "2 ops of the model's own code recorded" in out

"""`layerlab explain-shape`: every mode, JSON, exit codes and bad flags."""

import json

import pytest
import torch


def test_single_conv_step_by_step(run):
    code, out, err = run("explain-shape", "--input", "32", "--kernel", "3", "--stride", "2")
    assert code == 0, out + err
    assert "(1, 1, 15, 15)" in out
    assert "(32 + 2·0 − 3) // 2 + 1" in out or "32" in out
    assert "cropped" in out  # pixel 31 is never read
    assert tuple(torch.nn.Conv2d(1, 1, 3, 2)(torch.zeros(1, 1, 32, 32)).shape) == (1, 1, 15, 15)


def test_json_single(run):
    code, out, err = run("explain-shape", "--input", "2,3,32,32", "--kernel", "3", "--stride", "2",
                         "--padding", "1", "--out-channels", "8", "--json")
    assert code == 0, out + err
    data = json.loads(out)
    assert data["schema"] == 1 and data["kind"] == "explanation"
    assert data["output_shape"] == list(torch.nn.Conv2d(3, 8, 3, 2, 1)(torch.zeros(2, 3, 32, 32)).shape)
    assert [s["dim"] for s in data["steps"]] == ["H", "W"]
    assert data["error"] is None and data["ok"] is True


def test_torch_would_raise_exits_1_and_quotes_torch(run):
    code, out, err = run("explain-shape", "--op", "max_pool", "--input", "2", "--kernel", "3", "--stride", "2")
    assert code == 1, out + err
    assert "torch would raise" in out and "RuntimeError" in out
    code, out, err = run("explain-shape", "--op", "max_pool", "--input", "2", "--kernel", "3", "--stride", "2",
                         "--json")
    assert code == 1, out + err
    assert json.loads(out)["error"]["torch_message"] == (
        "Given input size: (1x2x2). Calculated output size: (1x0x0). Output size is too small")
    with pytest.raises(RuntimeError, match="Output size is too small"):
        torch.nn.MaxPool2d(3, 2)(torch.zeros(1, 1, 2, 2))


def test_torch_would_raise_json(run):
    code, out, err = run("explain-shape", "--input", "8", "--kernel", "3", "--stride", "2", "--padding", "same",
                         "--json")
    assert code == 1, out + err
    data = json.loads(out)
    assert data["ok"] is False and data["output_shape"] is None
    assert data["error"]["torch_exception"] == "ValueError"
    assert "padding='same' is not supported for strided convolutions" in data["error"]["torch_message"]


def test_general_formula_and_table_without_input(run):
    code, out, err = run("explain-shape", "--kernel", "3", "--stride", "2")
    assert code == 0, out + err
    assert "formula" in out and "no pixel lost" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()[:1].isdigit()}
    assert lines["32"].split()[1] == "15" and lines["33"].split()[1] == "16"


def test_table_json(run):
    code, out, err = run("explain-shape", "--kernel", "3", "--stride", "2", "--json")
    assert code == 0, out + err
    data = json.loads(out)
    assert data["kind"] == "size-table"
    row = next(r for r in data["rows"] if r["input"] == 32)
    assert (row["output"], row["lost_pixels"]) == (15, 1)


def test_target(run):
    code, out, err = run("explain-shape", "--input", "32", "--kernel", "3", "--stride", "1", "--target", "32",
                         "--json")
    assert code == 0, out + err
    data = json.loads(out)
    assert data["kind"] == "inverse"
    assert [c["params"] for c in data["dims"][0]["candidates"]] == [{"kernel_size": 3, "stride": 1, "padding": 1}]
    # Stride left free: the grid is searched, and stride 1 with padding 1 comes first.
    code, out, err = run("explain-shape", "--input", "32", "--kernel", "3", "--target", "32", "--json")
    cands = [c["params"] for c in json.loads(out)["dims"][0]["candidates"]]
    assert cands[0] == {"kernel_size": 3, "stride": 1, "padding": 1}
    assert all(c["padding"] <= 2 for c in cands)


def test_target_unreachable_exits_1(run):
    code, out, err = run("explain-shape", "--op", "max_pool", "--input", "8", "--kernel", "3", "--stride", "1",
                         "--dilation", "2", "--target", "8")
    assert code == 1, out + err


def test_undo(run):
    code, out, err = run("explain-shape", "--op", "conv_transpose", "--input", "12", "--kernel", "2", "--stride",
                         "2", "--undo", "25")
    assert code == 0, out + err
    assert "output_padding=1" in out


def test_chain(run):
    code, out, err = run("explain-shape", "--input", "224", "--chain", "conv k=7 s=2 p=3 out=64 | maxpool k=3 s=2 p=1")
    assert code == 0, out + err
    assert "(1, 64, 56, 56)" in out


def test_chain_notes_column_names_the_notes_of_each_stage(run):
    """32 → conv k=3 s=2 crops a row and a column (torch's output is 15: 31 of 32 read); the ceil-mode
    pool then adds a last window in each dim (8, where floor mode gives 7), as torch's pool does."""
    import torch
    import torch.nn.functional as F

    y = F.conv2d(torch.zeros(1, 1, 32, 32), torch.zeros(1, 1, 3, 3), stride=2)
    assert y.shape[-2:] == (15, 15) and F.max_pool2d(y, 2, 2, ceil_mode=True).shape[-2:] == (8, 8)
    code, out, err = run("explain-shape", "--input", "32", "--chain", "conv k=3 s=2 | maxpool k=2 s=2 ceil")
    assert code == 0, out + err
    rows = [line for line in out.splitlines() if line.startswith(("1 ", "2 "))]
    assert "cropped ×2" in rows[0] and "ceil-extra-window ×2" in rows[1], out


def test_chain_json_and_failure(run):
    code, out, err = run("explain-shape", "--input", "8", "--chain", "conv k=3 s=2 | conv k=5", "--json")
    assert code == 1, out + err
    data = json.loads(out)
    assert data["kind"] == "chain" and data["ok"] is False and len(data["stages"]) == 2


@pytest.mark.parametrize("args, flag", [
    (["--kernel", "-1"], "--kernel-size"),
    (["--kernel", "3", "--padding", "foo"], "--padding"),
    (["--kernel", "3", "--input", "0"], "--input"),
    (["--kernel", "3", "--input", "abc"], "--input"),
    (["--kernel", "3x3x3", "--input", "32x32"], "--kernel-size"),
    (["--kernel", "3", "--stride", "2x2", "--input", "32"], None),  # 2-D op: a 2-tuple is fine
    (["--kernel", "3", "--input", "32x32x32x32"], "--input"),
    (["--op", "convv", "--kernel", "3"], "--op"),
    (["--kernel", "3", "--stride", "0"], "--stride"),
    (["--kernel", "3", "--scale-factor", "abc"], "--scale-factor"),
    (["--input", "32", "--chain", "conv k3"], "--chain"),
    (["--kernel", "3", "--target", "16"], "--target"),
])
def test_bad_flags_one_line_exit_2(run, args, flag):
    code, out, err = run("explain-shape", *args)
    if flag is None:
        assert code == 0, out + err
        return
    assert code == 2, out + err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error:") and flag in lines[0]
    assert "Traceback" not in err


def test_explain_shape_help(run):
    code, out, err = run("explain-shape", "--help")
    assert code == 0, err
    for flag in ("--kernel-size", "--stride", "--padding", "--dilation", "--ceil-mode", "--output-padding",
                 "--target", "--chain", "--json"):
        assert flag in out

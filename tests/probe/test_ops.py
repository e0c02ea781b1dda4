"""The op trace (``inspect(ops=True)`` / ``--ops``), where a failing input came from, and the honesty
of the failure report (not-checked formulas, counted failures, messages that stand alone)."""

import linecache

import torch
import torch.nn as nn
import torch.nn.functional as F

import layerlab
from layerlab.probe.fixes import apply_fixes



class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.reshape(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.reshape(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.reshape(B, T, self.heads, C // self.heads).transpose(1, 2)
        att = F.softmax(q @ k.transpose(-2, -1), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.out(y)


def _line(needle: str) -> int:
    lines = linecache.getlines(__file__)
    return next(i for i, text in enumerate(lines, start=1) if needle in text)


def test_ops_of_the_models_own_code_are_recorded_with_shapes_sources_and_producers():
    report = layerlab.inspect(Attention(), torch.randn(2, 5, 16), ops=True)
    assert report.ok
    names = [o.op for o in report.ops]
    # the model's own ops, in order; nothing from inside nn.Linear (F.linear) nor layerlab's statistics
    assert names[:2] == ["chunk", "reshape"] and "F.linear" not in names and "aminmax" not in names
    assert names.count("transpose") == 5 and names.count("matmul") == 2 and "F.softmax" in names
    chunk = report.ops[0]
    assert chunk.inputs[0].shape == [2, 5, 48] and chunk.outputs == [[2, 5, 16]] * 3
    assert chunk.inputs[0].from_call == report.call("qkv").index  # the Linear's output
    assert chunk.source == f"{__file__.rsplit('/', 1)[-1]}:{_line('self.qkv(x).chunk')}" or \
        chunk.source.endswith(f"test_ops.py:{_line('self.qkv(x).chunk')}")
    assert chunk.code == "q, k, v = self.qkv(x).chunk(3, dim=-1)"
    scores = next(o for o in report.ops if o.op == "matmul")
    assert scores.inputs[0].shape == [2, 2, 5, 8] and scores.inputs[1].shape == [2, 2, 8, 5]
    assert report.ops[scores.inputs[1].from_op].op == "transpose"  # k.transpose(-2, -1) made it
    # ops nest under the module call running at the time, and sit between the right rows
    assert all(o.call == 0 for o in report.ops)
    assert chunk.after_call == 2 and report.ops[-1].after_call == 2
    out_linear = report.call("out")
    assert out_linear.inputs[0].shape == [2, 5, 16]


def test_ops_change_nothing_the_report_measures():
    torch.manual_seed(0)
    model, x = Attention(), torch.randn(2, 5, 16)
    plain = layerlab.inspect(model, x)
    traced = layerlab.inspect(model, x, ops=True)
    assert plain.ops is None and traced.ops
    assert [c.outputs[0].stats.mean for c in plain.calls] == [c.outputs[0].stats.mean for c in traced.calls]
    assert [p.grad_norm for p in plain.params] == [p.grad_norm for p in traced.params]


def test_torch_nn_models_record_no_internal_ops():
    model = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, batch_first=True)
    report = layerlab.inspect(model, torch.randn(2, 5, 16), ops=True)
    assert report.ok and report.ops == []


class ViewAfterTranspose(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 3)

    def forward(self, x):
        x = x.transpose(1, 2)
        x = x.view(x.size(0), -1)
        return self.fc(x)


def test_an_op_failure_names_the_op_its_line_and_where_its_input_came_from():
    model = ViewAfterTranspose()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = layerlab.inspect(model, torch.randn(2, 3, 4))
    f = report.failure
    assert f.path == "" and f.op.op == "view" and f.op.status == "raised"
    assert f.op.source.endswith(f"test_ops.py:{_line('x = x.view(x.size(0), -1)')}")
    assert f.origins[0].text.startswith("x [2, 4, 3] came from `x.transpose(1, 2)` at ")
    assert f.origins[0].text.endswith(f"test_ops.py:{_line('x = x.transpose(1, 2)')}, applied to a model input")
    d = f.diagnosis
    assert d.cause == "non-contiguous" and d.fix.kind == "replace-op" and d.fix.code == "reshape"
    assert d.verified.status == "runs" and d.verified.outputs == [[2, 3]]
    # the user's model is untouched: same weights, no hooks left behind
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())
    # and the verified fix computes what x.reshape(…) by hand computes
    x = torch.randn(2, 3, 4)
    fixed = apply_fixes(model, d.verified.steps)
    torch.testing.assert_close(fixed(x), model.fc(x.transpose(1, 2).reshape(2, -1)))

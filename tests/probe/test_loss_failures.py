"""A ``loss=`` that raises: phase "loss", the failing op and line named, the rules' fix, and a
"verified" fix that computes the hand-fixed twin's loss on the same weights (or no fix claimed).
A failure inside autograd's backward stays a "backward" failure."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import layerlab
from layerlab.probe.loss_failure import fixed_loss


def _line(fn, text: str) -> str:
    """``test_loss_failures.py:N``: the line of ``fn``'s source that holds ``text``."""
    import inspect

    lines, start = inspect.getsourcelines(fn)
    for i, line in enumerate(lines):
        if text in line:
            return f"test_loss_failures.py:{start + i}"
    raise AssertionError(text)


def _check(model, inputs, loss, twin, *, op=None, line_text=None, module=None, fix_code=None):
    """Inspect with ``loss``; assert the failure is the loss's, where it is, the first fix, and that a
    verified fix computes ``twin(model(*inputs))`` (the hand-fixed loss) on the same weights."""
    report = layerlab.inspect(model, *inputs, loss=loss)
    f = report.failure
    assert f is not None and f.phase == "loss", f
    if op is not None:
        assert f.op is not None and f.op.op == op and f.op.status == "raised"
        assert f.op.source.endswith(_line(loss, line_text)), f.op.source
    if module is not None:
        assert f.class_name == module and f.path == "loss"
        assert f.chain and f.chain[0].endswith(_line(loss, line_text))
    d = f.diagnosis
    if fix_code is not None:
        assert d is not None and d.fix is not None and d.fix.code == fix_code, d
    with torch.no_grad():
        expected = twin(model(*inputs))
    if d is not None and d.verified is not None and d.verified.status == "runs":
        fixed = fixed_loss(model, loss, d.verified.steps, tuple(inputs))
        with torch.no_grad():
            got = fixed(*inputs)
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6), (float(got), float(expected))
    else:
        assert fix_code is None, d and d.verified
    return f


def test_bce_target_of_the_batch_for_one_logit_per_sample():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    x, y = torch.randn(6, 8), torch.randint(0, 2, (6,)).float()

    def loss(out):
        return F.binary_cross_entropy_with_logits(out, y)

    f = _check(model, (x,), loss, lambda out: F.binary_cross_entropy_with_logits(out, y.view(-1, 1)),
               op="F.binary_cross_entropy_with_logits", line_text="binary_cross_entropy_with_logits(out, y)",
               fix_code="target.view_as(logits)")
    assert f.diagnosis.verified.checks == ["backward", "batch"]
    assert any("(Linear)" in o.text for o in f.origins)  # the logits came from the model's last layer


def test_cross_entropy_with_float_class_indices():
    torch.manual_seed(0)
    model = nn.Linear(10, 4)
    x, y = torch.randn(5, 10), torch.tensor([0., 3., 1., 2., 3.])

    def loss(out):
        return F.cross_entropy(out, y)

    _check(model, (x,), loss, lambda out: F.cross_entropy(out, y.long()),
           op="F.cross_entropy", line_text="F.cross_entropy(out, y)", fix_code="target.long()")


def test_cross_entropy_with_the_classes_last():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(30, 12), nn.Linear(12, 7))
    ids, tags = torch.randint(0, 30, (3, 9)), torch.randint(0, 7, (3, 9))

    def loss(out):
        return F.cross_entropy(out, tags)

    _check(model, (ids,), loss, lambda out: F.cross_entropy(out.transpose(1, 2), tags),
           op="F.cross_entropy", line_text="F.cross_entropy(out, tags)", fix_code="logits.transpose(1, 2)")


def test_cross_entropy_module_with_the_classes_last():
    torch.manual_seed(0)
    model = nn.Linear(12, 5)
    x, tags = torch.randn(2, 6, 12), torch.randint(0, 5, (2, 6))
    criterion = nn.CrossEntropyLoss()

    def loss(out):
        return criterion(out, tags)

    f = _check(model, (x,), loss, lambda out: nn.CrossEntropyLoss()(out.transpose(1, 2), tags),
               module="CrossEntropyLoss", line_text="criterion(out, tags)", fix_code="logits.transpose(1, 2)")
    assert [(o.input, o.steps[-1]) for o in f.origins] == [
        ("input", "`(root)` (Linear)"), ("target", "a tensor the loss holds (not made by the model)")]


def test_mse_against_a_target_with_a_trailing_axis():
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    x, y = torch.randn(4, 6), torch.randn(4, 3, 1)

    def loss(out):
        return F.mse_loss(out, y)

    f = _check(model, (x,), loss, lambda out: F.mse_loss(out, y.squeeze(-1)),
               op="F.mse_loss", line_text="F.mse_loss(out, y)", fix_code="target.squeeze(-1)")
    assert f.exception == "RuntimeError"


def test_ctc_given_batch_first_log_probs():
    torch.manual_seed(0)
    N, T, C, S = 3, 12, 6, 4
    model = nn.Sequential(nn.Linear(8, C), nn.LogSoftmax(-1))
    x = torch.randn(N, T, 8)
    targets = torch.randint(1, C, (N, S))
    in_lengths, tgt_lengths = torch.full((N,), T), torch.full((N,), S)

    def loss(out):
        return F.ctc_loss(out, targets, in_lengths, tgt_lengths)

    _check(model, (x,), loss, lambda out: F.ctc_loss(out.transpose(0, 1), targets, in_lengths, tgt_lengths),
           op="F.ctc_loss", line_text="F.ctc_loss(out, targets", fix_code="log_probs.transpose(0, 1)")


def test_custom_loss_with_a_broadcast_error_in_user_code():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(4, 5), torch.randn(4, 2)

    def loss(out):
        diff = out - y
        return diff.pow(2).mean()

    f = _check(model, (x,), loss, lambda out: (out[:, :2] - y).pow(2).mean(),
               op="sub", line_text="diff = out - y")
    d = f.diagnosis
    # the head's width or the target's: a run cannot tell, so a resize of the head is not "verified"
    assert d is None or d.fix is None or d.verified is None or d.verified.status != "runs", d.verified
    # y is the loss's own tensor, not an input of the model: in the origins and in the rule's words
    assert any(o.input == "arg1" and "the loss holds" in o.text for o in f.origins), [o.text for o in f.origins]
    assert d is None or "model input" not in d.message, d.message


def test_a_loss_that_returns_no_scalar_is_a_loss_failure():
    model = nn.Linear(3, 2)
    report = layerlab.inspect(model, torch.randn(4, 3), loss=lambda out: out.pow(2))
    f = report.failure
    assert f.phase == "loss" and f.exception == "TypeError" and "scalar" in f.message


def test_the_loss_ops_are_in_the_op_trace_and_the_rules_run_without_copies():
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    x, y = torch.randn(3, 4), torch.ones(3)

    def loss(out):
        return F.binary_cross_entropy_with_logits(out, y)

    report = layerlab.inspect(model, x, loss=loss, ops=True, fix=False)
    raised = [r for r in report.ops if r.status == "raised"]
    assert [r.op for r in raised] == ["F.binary_cross_entropy_with_logits"]
    assert raised[0].source.endswith(_line(loss, "binary_cross_entropy_with_logits(out, y)"))
    d = report.failure.diagnosis
    assert d is not None and d.fix.code == "target.view_as(logits)" and d.verified is None


def test_a_right_loss_still_runs_backward():
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    x, y = torch.randn(3, 4), torch.ones(3, 1)
    report = layerlab.inspect(model, x, loss=lambda out: F.binary_cross_entropy_with_logits(out, y), ops=True)
    assert report.ok and report.backward.ran
    assert abs(report.backward.loss_value - float(F.binary_cross_entropy_with_logits(model(x), y))) < 1e-6


def test_a_right_loss_module_is_no_failure():
    torch.manual_seed(0)
    model, x, tags = nn.Linear(12, 5), torch.randn(2, 6, 12), torch.randint(0, 5, (2, 6))
    criterion = nn.CrossEntropyLoss()
    report = layerlab.inspect(model, x, loss=lambda out: criterion(out.transpose(1, 2), tags))
    assert report.ok and report.failure is None
    expected = float(nn.CrossEntropyLoss()(model(x).transpose(1, 2), tags))
    assert abs(report.backward.loss_value - expected) < 1e-6


class _Refuses(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("this backward refuses")


class _WithRefusingBackward(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return _Refuses.apply(self.fc(x))


def test_a_backward_that_raises_is_a_backward_failure():
    model = _WithRefusingBackward()
    x = torch.randn(2, 4)
    for loss in (None, lambda out: out.sum()):
        f = layerlab.inspect(model, x, loss=loss).failure
        assert f is not None and f.phase == "backward" and "refuses" in f.message


# -- the checks a fixed loss must pass (FixedLoss judged directly: a fix the rules never give) -----------
def _judge(model, x, loss):
    from layerlab.probe.loss_checks import judge
    from layerlab.probe.loss_failure import FixedLoss

    fixed = FixedLoss.build(model, None, loss, {})
    outcome = fixed.traced((x,), {}, 0)
    assert outcome.ok
    return judge(fixed, model, (x,), {}, 0, outcome, [], [])


def test_a_loss_that_pairs_every_sample_with_every_other_is_not_plausible():
    torch.manual_seed(0)
    model, x, y = nn.Linear(3, 1), torch.randn(5, 3), torch.randn(5)
    v = _judge(model, x, lambda out: (out - y).pow(2).mean())  # (5, 1) - (5,) -> (5, 5): runs
    assert v.status == "implausible" and v.failed_check == "batch" and "pairs every sample" in v.note
    near = _judge(model, x, lambda out: (out - y[:, None]).pow(2).mean())  # the same numbers, per sample
    assert near.status == "runs" and near.checks == ["backward", "batch"]


def test_a_loss_that_mixes_the_samples_is_not_plausible():
    torch.manual_seed(0)
    model, x = nn.Linear(3, 4), torch.randn(6, 3)
    target = torch.randint(0, 4, (6,))
    v = _judge(model, x, lambda out: F.cross_entropy(out.softmax(0), target))  # a softmax over the batch
    assert v.status == "implausible" and v.failed_check == "batch"
    near = _judge(model, x, lambda out: F.cross_entropy(out.log_softmax(1), target))
    assert near.status == "runs"


def test_a_loss_whose_backward_fails_is_not_plausible():
    model, x = _WithRefusingBackward(), torch.randn(2, 4)
    v = _judge(model, x, lambda out: out.sum())
    assert v.status == "implausible" and v.failed_check == "backward" and "refuses" in v.note


# -- the same loss inside a forward and as loss=: the same diagnosis ------------------------------------
class _LossInForward(nn.Module):
    """A model that computes its loss in forward, from a target it is given (as a training step does)."""

    def __init__(self, model, fn):
        super().__init__()
        self.model, self.fn = model, fn

    def forward(self, x, target):
        return self.fn(self.model(x), target)


def _parity_cases():
    torch.manual_seed(1)
    return [
        ("bce", nn.Linear(4, 1), torch.randn(6, 4), torch.randint(0, 2, (6,)).float(),
         lambda out, t: F.binary_cross_entropy_with_logits(out, t)),
        ("ce-float", nn.Linear(4, 3), torch.randn(6, 4), torch.tensor([0., 2., 1., 2., 0., 1.]),
         lambda out, t: F.cross_entropy(out, t)),
        ("ce-last", nn.Linear(4, 3), torch.randn(6, 5, 4), torch.randint(0, 3, (6, 5)),
         lambda out, t: F.cross_entropy(out, t)),
        ("mse-trailing", nn.Linear(4, 3), torch.randn(6, 4), torch.randn(6, 3, 1), lambda out, t: F.mse_loss(out, t)),
    ]


def test_a_loss_gets_the_diagnosis_it_gets_inside_a_forward():
    for name, model, x, target, fn in _parity_cases():
        inside = layerlab.inspect(_LossInForward(model, fn), x, target).failure
        outside = layerlab.inspect(model, x, loss=lambda out: fn(out, target)).failure
        assert inside.phase == "forward" and outside.phase == "loss", name
        a, b = inside.diagnosis, outside.diagnosis
        assert a is not None and b is not None and a.fix is not None and b.fix is not None, name
        assert (a.rule_id, a.fix.code) == (b.rule_id, b.fix.code), name
        assert inside.op.source == outside.op.source, name
        assert a.verified.status == b.verified.status == "runs", (name, a.verified, b.verified)


def test_without_copies_or_a_trace_the_loss_failure_is_located_not_diagnosed():
    model, x, y = nn.Linear(4, 3), torch.randn(2, 4), torch.tensor([0., 2.])

    def loss(out):
        return F.cross_entropy(out, y)

    f = layerlab.inspect(model, x, loss=loss, fix=False).failure
    assert f.phase == "loss" and f.diagnosis is None
    assert len(f.chain) == 1 and f.chain[0].endswith(_line(loss, "F.cross_entropy(out, y)"))


def test_a_loss_failure_on_meta_is_not_diagnosed_as_the_real_runs():
    model, x, y = nn.Linear(4, 3), torch.randn(2, 4), torch.tensor([0, 2])
    f = layerlab.inspect(model, x, loss=lambda out: F.cross_entropy(out, y), meta=True).failure
    assert f.phase == "loss" and f.diagnosis.cause == "meta" and f.diagnosis.fix is None


def test_a_batch_check_that_cannot_run_is_not_listed_as_passed():
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(3, 1), nn.Sigmoid()), torch.randn(4, 3)
    target = torch.ones(4, 1)

    def refuses_mixed(out):  # a loss that checks its input exactly: the mixed outputs fail it
        if not torch.equal(out.detach(), model(x).detach()):
            raise ValueError("not the model's output")
        return F.binary_cross_entropy(out, target)

    v = _judge(model, x, refuses_mixed)
    assert v.status == "runs" and v.checks == ["backward"]

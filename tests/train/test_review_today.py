"""A new user's review of train-check verdicts: five wrong or misleading ones, each fixed against
plain-torch evidence, with the real bug beside it still caught.

1. an Embedding fed only its padding_idx beside other inputs that still fit: a warning, not an error;
2. soft targets (BCE, BCE-with-logits with label smoothing, cross_entropy with probabilities): the
   loss's exact floor is the targets' entropy; the fall is judged above it;
3. weights tied inside forward: not "no-grad … cut off by .detach()";
4. constant-output compares rows within a relative 1e-6, not bit for bit; equal inputs never come
   with "run more steps";
5. dropout-high names every module it found.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import layerlab
from layerlab.errors import CheckFailed
from layerlab.train import constant_output, floor as floors
from layerlab.train.loss import Objective

pytestmark = pytest.mark.usefixtures("one_thread")

N = 16


def _check(model, *inputs, **kw):
    try:
        return layerlab.train_check(model, *inputs, threads=1, **kw)
    except CheckFailed as failed:  # the report of a failed check is what is asserted on
        return failed.report


def _plain(model, inputs, loss, steps, lr=1e-2):
    """A plain Adam loop on one batch (optimizer built before the first forward, as a user's is)."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        value = loss(model(*inputs))
        losses.append(value.item())
        value.backward()
        opt.step()
    return losses


def _gen(seed=1):
    return torch.Generator().manual_seed(seed)


# 1. an all-padding segment embedding ------------------------------------------------------------


class SegModel(nn.Module):
    def __init__(self, with_tokens=True):
        super().__init__()
        torch.manual_seed(0)
        self.with_tokens = with_tokens
        self.tok, self.seg = nn.Embedding(20, 16), nn.Embedding(3, 16, padding_idx=0)
        self.head = nn.Linear(16, 4)

    def forward(self, ids, seg):
        h = self.seg(seg) + (self.tok(ids) if self.with_tokens else 0)
        return self.head(h.mean(1))


def _seg_data():
    g = _gen()
    return torch.randint(1, 20, (N, 6), generator=g), torch.zeros(N, 6, dtype=torch.long), \
        torch.randint(0, 4, (N,), generator=g)


def test_a_single_segment_batch_is_a_warning_when_the_model_still_overfits():
    ids, seg, y = _seg_data()
    model = SegModel()
    losses = _plain(SegModel(), (ids, seg), lambda out: F.cross_entropy(out, y), 100, lr=3e-2)
    assert losses[0] / min(losses[-5:]) >= 10  # the truth: it overfits with the segment ids all padding
    probe = SegModel()
    F.cross_entropy(probe(ids, seg), y).backward()
    assert torch.equal(probe.seg.weight.grad, torch.zeros(3, 16))  # and the segment embedding gets nothing
    report = _check(model, ids, seg, loss="cross_entropy", target=y, steps=100, lr=3e-2)
    assert report.fit.verdict == "overfits" and report.ok, report.flags
    (flag,) = [f for f in report.flags if f.code == "zero-grad" and f.where == "seg"]
    assert flag.severity == "warning" and "padding_idx 0" in flag.message and "still overfits" in flag.message


def test_an_all_padding_embedding_that_is_all_the_prediction_sees_is_still_an_error():
    ids, seg, y = _seg_data()
    model = SegModel(with_tokens=False)
    with torch.no_grad():  # the truth: every sample gets the same prediction, so the loss cannot fit
        out = model(ids, seg)
    assert torch.equal(out, out[:1].expand_as(out))
    report = _check(model, ids, seg, loss="cross_entropy", target=y)
    assert report.fit.verdict != "overfits"
    flag = next(f for f in report.flag("zero-grad") if f.where == "seg")
    assert flag.severity == "error" and "padding_idx 0" in flag.message and not report.ok


# 2. soft targets: the loss's exact floor -------------------------------------------------------


def _mlp(out_act=None, o=4):
    torch.manual_seed(0)
    layers = [nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, o)]
    return nn.Sequential(*layers, *([out_act] if out_act is not None else []))


def _entropy(t):  # by hand, per element, for binary targets
    return float(-(t * t.log() + (1 - t) * (1 - t).log()).mean())


def _soft_cases():
    g = _gen(2)
    x = torch.randn(N, 8, generator=g)
    soft = torch.rand(N, 4, generator=g) * 0.8 + 0.1
    smoothed = torch.randint(0, 2, (N, 4), generator=g).float() * 0.9 + 0.05  # label smoothing 0.1
    probs = torch.softmax(torch.randn(N, 4, generator=g), 1)
    return x, [
        ("bce", nn.Sigmoid(), nn.BCELoss(), soft, _entropy(soft)),
        ("bce_logits", None, nn.BCEWithLogitsLoss(), smoothed, _entropy(smoothed)),
        ("ce_probs", None, F.cross_entropy, probs, float(-(probs * probs.log()).sum(1).mean())),
    ]


@pytest.mark.parametrize("case", range(3), ids=["bce", "bce_logits", "ce_probs"])
def test_a_soft_target_is_judged_above_its_floor(case):
    x, cases = _soft_cases()
    _, act, loss, t, entropy = cases[case]
    objective = Objective("loss", "output", loss, t, "given")
    value, why = floors.exact_floor(objective)
    assert value == pytest.approx(entropy, rel=1e-5)  # the targets' entropy, computed by hand
    if case == 0:
        assert value == pytest.approx(float(loss(t, t)), rel=1e-6)  # torch's own BCE(t, t)
    # a long plain Adam run reaches the floor, and no lower
    losses = _plain(_mlp(act), (x,), lambda out: loss(out, t), 1500)
    assert min(losses) >= value - 1e-4 and min(losses[-5:]) - value < 0.01 * (losses[0] - value)
    report = _check(_mlp(act), x, loss=loss, target=t, steps=80)
    assert report.fit.verdict == "overfits" and report.ok, report.fit.message
    assert "floor" in report.fit.message and f"{value:.4g}" in report.fit.message
    assert "more steps" not in report.fit.message
    assert report.fit.factor == pytest.approx((report.fit.initial - value) / (report.fit.final - value), rel=1e-6)


def test_a_model_that_cannot_reach_the_soft_floor_is_not_called_overfitting():
    x, cases = _soft_cases()
    _, act, loss, t, entropy = cases[0]
    torch.manual_seed(0)
    linear = nn.Sequential(nn.Linear(8, 4), nn.Sigmoid())  # 36 values for 64 soft targets
    import copy

    losses = _plain(copy.deepcopy(linear), (x,), lambda out: loss(out, t), 1500)
    best = min(losses)
    assert (losses[0] - entropy) / (best - entropy) < 10  # the truth: even 1500 steps stay far above it
    report = _check(linear, x, loss=loss, target=t)
    assert report.fit.verdict != "overfits", report.fit.message


def test_hard_targets_have_no_floor_to_adjust():
    t = torch.randint(0, 2, (N, 4), generator=_gen()).float()
    assert floors.exact_floor(Objective("loss", "output", nn.BCEWithLogitsLoss(), t, "given")) is None
    assert floors.exact_floor(Objective("mse", "output", F.mse_loss, t, "given")) is None
    weighted = nn.BCEWithLogitsLoss(pos_weight=torch.full((4,), 3.0))  # its minimum is not the entropy
    assert floors.exact_floor(Objective("loss", "output", weighted, t * 0.8 + 0.1, "given")) is None


# 3. weights tied inside forward -------------------------------------------------------------------


class TiedInForward(nn.Module):
    def __init__(self, tie_in_forward=True):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.head = nn.Embedding(20, 16), nn.Linear(16, 20)
        self.tie_in_forward = tie_in_forward
        if not tie_in_forward:
            self.head.weight = self.emb.weight

    def forward(self, ids):
        if self.tie_in_forward:
            self.head.weight = self.emb.weight
        return self.head(torch.tanh(self.emb(ids).mean(1)))


def test_weights_tied_in_forward_are_not_called_detached():
    g = _gen()
    ids, y = torch.randint(0, 20, (N, 6), generator=g), torch.randint(0, 20, (N,), generator=g)
    plain = TiedInForward()
    original = plain.head.weight
    losses = _plain(plain, (ids,), lambda out: F.cross_entropy(out, y), 50)
    assert min(losses[-5:]) < 0.7 * losses[0]  # the truth: the head's output reaches the loss and it learns
    assert original.grad is None and plain.head.weight is plain.emb.weight  # the original never trains
    report = _check(TiedInForward(), ids, loss="cross_entropy", target=y)
    assert not [f for f in report.flags if f.code == "no-grad"], report.flags
    (flag,) = report.flag("recreated-in-forward")
    assert flag.severity == "warning" and flag.where == "head.weight"
    assert "head.weight = emb.weight" in flag.message and "never trains" in flag.message
    assert "__init__" in flag.hint
    tied = _check(TiedInForward(tie_in_forward=False), ids, loss="cross_entropy", target=y)
    assert not tied.flag("recreated-in-forward") and not tied.errors


class Recreated(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.scale = nn.Linear(8, 4), nn.Parameter(torch.ones(4))

    def forward(self, x):
        self.scale = nn.Parameter(torch.ones(4))  # a new object, not another registered parameter
        return self.fc(x) * self.scale


def test_a_parameter_recreated_in_forward_is_still_an_error():
    g = _gen()
    report = _check(Recreated(), torch.randn(N, 8, generator=g), loss="cross_entropy",
                    target=torch.randint(0, 4, (N,), generator=g))
    (flag,) = report.flag("recreated-in-forward")
    assert flag.severity == "error" and flag.where == "scale"


# 4. constant-output within a relative 1e-6 -----------------------------------------------------


def test_rows_one_ulp_apart_count_as_equal_and_rows_1e_4_apart_do_not():
    row = torch.randn(1, 12, generator=_gen())
    rows = row.expand(4, 12).clone()
    rows[1] = torch.nextafter(rows[1], torch.full_like(rows[1], math.inf))  # what a batched matmul may give
    assert not torch.equal(rows[0], rows[1])
    assert constant_output.rows_equal(rows) and constant_output.rows_equal_any(rows)
    rows[2] = rows[2] * (1 + 1e-4)
    assert not constant_output.rows_equal(rows)
    ids = torch.tensor([[3, 4], [3, 5]])
    assert not constant_output.rows_equal_any(ids)  # integers: exact


class UlpApart(nn.Module):
    """Rows of equal inputs whose outputs differ in the last bit, as batched kernels may give them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x):
        out = self.net(x)
        bump = torch.nextafter(out, torch.full_like(out, math.inf)) - out
        return out + bump * (torch.arange(out.shape[0]) % 2).unsqueeze(1)


def test_equal_inputs_fit_the_targets_mean_and_never_say_run_more_steps():
    same = torch.ones(6, 8)
    model = UlpApart()
    with torch.no_grad():
        out = model(same)
    assert not torch.equal(out[0], out[1])  # the premise: not bit-equal rows
    report = _check(model, same, steps=20)
    (flag,) = report.flag("constant-output")
    assert flag.severity == "warning" and "same input" in flag.message and report.ok
    assert "run more steps" not in report.fit.message and "--steps" not in report.fit.message
    # the floor of a constant prediction under mse: the variance of the target rows, by hand
    y = torch.randn(6, 3, generator=torch.Generator().manual_seed(layerlab.train.loss.target_seed(0)))
    variance = float(((y - y.mean(0)) ** 2).mean())
    assert f"{variance:.4g}" in report.fit.message
    # and with L1 (no exact floor claimed), the message still withdraws "more steps"
    l1 = _check(UlpApart(), same, loss=F.l1_loss, target=y, steps=20)
    assert l1.fit.verdict in ("falls", "slow") and l1.flag("constant-output")
    assert "best single prediction" in l1.fit.message and "--steps" not in l1.fit.message
    assert not l1.flag("loss-slow")


def test_a_model_that_ignores_differing_inputs_is_still_an_error():
    class FirstToken(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.emb, self.head = nn.Embedding(20, 16), nn.Linear(16, 4)

        def forward(self, ids):
            return self.head(self.emb(ids)[:, 0])  # reads the BOS position every sample shares

    g = _gen()
    ids = torch.randint(1, 20, (N, 6), generator=g)
    ids[:, 0] = 1
    report = _check(FirstToken(), ids, loss="cross_entropy", target=torch.randint(0, 4, (N,), generator=g))
    (flag,) = report.flag("constant-output")
    assert flag.severity == "error"


# 5. dropout-high names every module -------------------------------------------------------------


def test_two_high_dropouts_are_both_named():
    g = _gen()
    x, y = torch.randn(N, 16, generator=g), torch.randn(N, 4, generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Dropout(0.55), nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.55), nn.Linear(64, 4))
    report = _check(model, x, target=y)
    (flag,) = report.flag("dropout-high")
    assert "dropout 0 (p=0.55) and 3 (p=0.55) drop 55 % of their inputs" in flag.message, flag.message
    assert "are what keep" in report.fit.message
    off = model.eval()  # the evidence, in plain torch: the same weights with dropout off overfit
    import copy

    losses = _plain(copy.deepcopy(off), (x,), lambda out: F.mse_loss(out, y), 50)
    assert losses[0] / min(losses[-5:]) >= 10
    assert flag.data["factor_dropout_off"] == pytest.approx(losses[0] / min(losses[-5:]), rel=1e-3)

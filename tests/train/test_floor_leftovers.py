"""train-check's loss floors, two leftovers: class-index targets under ``CrossEntropyLoss(label_smoothing=ε)``
had no floor (even perfect logits leave the smoothed target's entropy, so a healthy model "fell 4.42×,
short of 10×, run --steps 200"), and the replays that test a finding (dropout off, the loss divided
by N) were judged without the main run's floor (a replay that reached it read "does not overfit
either", and the dropout-high finding was dropped). Every floor is checked against logits optimised
directly in plain torch, and every "it fits" against a plain training loop.
Letters: N samples · C classes.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from layerlab.train import floor as floors
from layerlab.train.loss import Objective
from layerlab.train.run import train_check

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

N, C = 32, 10


def _gen(seed=1):
    return torch.Generator().manual_seed(seed)


def _data():
    g = _gen()
    return torch.randn(N, 16, generator=g), torch.randint(0, C, (N,), generator=g)


def _best_logits_loss(loss, target, shape, constant=False) -> float:
    """The truth: the lowest loss any logits reach, found by optimising the logits themselves (float64)."""
    z = torch.zeros((1, *shape[1:]) if constant else shape, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([z], max_iter=500, tolerance_grad=1e-12, tolerance_change=1e-15,
                            line_search_fn="strong_wolfe")
    fn = copy.deepcopy(loss)
    if isinstance(fn, nn.CrossEntropyLoss) and fn.weight is not None:
        fn.weight = fn.weight.double()

    def closure():
        opt.zero_grad()
        value = fn(z.expand(shape) if constant else z, target)
        value.backward()
        return value
    for _ in range(5):
        opt.step(closure)
    with torch.no_grad():
        return float(fn(z.expand(shape) if constant else z, target))


def _mlp(p=0.0):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Dropout(p), nn.Linear(128, C))


def _plain(model, x, loss, steps=50, lr=1e-2, opt="adam"):
    """The check's run in plain torch: ``steps`` steps on the batch, the losses."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr) if opt == "adam" else \
        torch.optim.SGD(model.parameters(), lr=lr)
    out = []
    for _ in range(steps):
        optimizer.zero_grad()
        value = loss(model(x))
        out.append(float(value.detach()))
        value.backward()
        optimizer.step()
    return out


# -- 1. the floor of a label-smoothed cross-entropy ----------------------------------------------------

@pytest.mark.parametrize("eps", [0.1, 0.3])
def test_label_smoothing_floor_is_the_loss_of_the_best_logits(eps):
    x, y = _data()
    loss = nn.CrossEntropyLoss(label_smoothing=eps)
    value, why = floors.exact_floor(Objective("loss", "output", loss, y, "given"), (N, C))
    assert value == pytest.approx(_best_logits_loss(loss, y, (N, C)), rel=1e-6)
    # the smoothed target's entropy, with torch: q = (1 − ε)·onehot + ε/C
    q = (1 - eps) * F.one_hot(torch.tensor(0), C).double() + eps / C
    assert value == pytest.approx(float(-(q * q.log()).sum()), rel=1e-6)
    assert f"label_smoothing={eps:g} over {C} classes" in why and f"{value:.4g}" in why


@pytest.mark.parametrize("kwargs", [dict(ignore_index=3), dict(weight="w"), dict(weight="w", ignore_index=3)],
                         ids=["ignore_index", "weight", "both"])
def test_weighted_and_ignored_floors_match_the_best_logits(kwargs):
    """With class weights the minimiser is no longer the smoothed target (p ∝ w ⊙ a), and the floor is
    not its entropy; ignored positions count for nothing. Each checked against optimised logits."""
    x, y = _data()
    if kwargs.get("weight") == "w":
        kwargs = {**kwargs, "weight": torch.rand(C, generator=_gen(3)) + 0.2}
    loss = nn.CrossEntropyLoss(label_smoothing=0.2, **kwargs)
    value, _ = floors.exact_floor(Objective("loss", "output", loss, y, "given"), (N, C))
    assert value == pytest.approx(_best_logits_loss(loss, y, (N, C)), rel=1e-6)


def test_hard_class_indices_still_have_no_floor_to_adjust():
    _, y = _data()
    assert floors.exact_floor(Objective("loss", "output", nn.CrossEntropyLoss(), y, "given"), (N, C)) is None
    assert floors.exact_floor(Objective("loss", "output", F.cross_entropy, y, "given"), (N, C)) is None


def test_one_prediction_for_every_sample_has_the_class_frequencies_floor():
    _, y = _data()
    loss = nn.CrossEntropyLoss(label_smoothing=0.1)
    value, why = floors.constant_floor(Objective("loss", "output", loss, y, "given"), (N, C))
    assert value == pytest.approx(_best_logits_loss(loss, y, (N, C), constant=True), rel=1e-6)
    assert "same input" in why


@pytest.mark.parametrize("eps", [0.1, 0.3])
def test_a_healthy_model_with_label_smoothing_overfits_down_to_its_floor(eps):
    x, y = _data()
    loss = nn.CrossEntropyLoss(label_smoothing=eps)
    value, _ = floors.exact_floor(Objective("loss", "output", loss, y, "given"), (N, C))
    losses = _plain(_mlp(), x, lambda out: loss(out, y))  # the truth, in plain torch
    assert min(losses) >= value - 1e-5 and (losses[0] - value) / (min(losses[-5:]) - value) >= 10
    assert losses[0] / min(losses[-5:]) < 10  # judged without the floor it would be "short of 10×"
    report = train_check(_mlp(), x, loss=loss, target=y)
    assert report.ok and report.fit.verdict == "overfits", report.fit.message
    assert f"{value:.4g}" in report.fit.message and "more steps" not in report.fit.message
    assert report.losses == pytest.approx(losses, rel=1e-4)


# -- 2. replays judged above the same floor --------------------------------------------------------------

def _soft_bce():
    g = _gen(2)
    return torch.rand(N, C, generator=g) * 0.8 + 0.1


@pytest.mark.parametrize("case", ["soft-bce", "label-smoothing"])
def test_a_dropout_replay_that_reaches_the_floor_confirms_dropout_high(case):
    """p=0.9: in train mode the loss stays up; with dropout off the same run reaches the floor. Judged
    without the floor the replay "did not overfit either" and dropout-high was dropped."""
    x, y = _data()
    loss, target = (nn.BCEWithLogitsLoss(), _soft_bce()) if case == "soft-bce" else \
        (nn.CrossEntropyLoss(label_smoothing=0.3), y)
    objective = Objective("loss", "output", loss, target, "given")  # a BCE's floor needs no class count
    value, _ = floors.exact_floor(objective) if case == "soft-bce" else floors.exact_floor(objective, (N, C))
    off = _mlp(0.9).eval()  # dropout off: the only module whose mode matters here is the Dropout
    torch.manual_seed(0)
    replayed = _plain(off, x, lambda out: loss(out, target))  # the truth of the replay, in plain torch
    assert (replayed[0] - value) / (min(replayed[-5:]) - value) >= 10 and replayed[0] / min(replayed[-5:]) < 10
    report = train_check(_mlp(0.9), x, loss=loss, target=target)
    (flag,) = report.flag("dropout-high")
    assert flag.where == "2" and flag.data["factor_dropout_off"] >= 10, flag.message
    assert flag.data["factor_dropout_off"] == pytest.approx(
        (replayed[0] - value) / (min(replayed[-5:]) - value), rel=1e-3)
    assert f"{value:.4g}" in flag.message and "above its floor" in flag.message
    assert report.fit.verdict != "overfits"


def test_a_summed_loss_replay_is_judged_above_the_floor_divided_by_n():
    x, _ = _data()
    t = _soft_bce()
    summed, mean = nn.BCEWithLogitsLoss(reduction="sum"), nn.BCEWithLogitsLoss()
    total, _ = floors.exact_floor(Objective("loss", "output", summed, t, "given"))
    per, _ = floors.exact_floor(Objective("loss", "output", mean, t, "given"))
    assert total / t.numel() == pytest.approx(per, rel=1e-6)  # the replay's floor: torch's own mean-loss floor
    replayed = _plain(_mlp(), x, lambda out: mean(out, t), lr=10.0, opt="sgd")  # what the replay runs
    assert (replayed[0] - per) / (min(replayed[-5:]) - per) >= 10 and replayed[0] / min(replayed[-5:]) < 10
    report = train_check(_mlp(), x, loss=summed, target=t, optimizer="sgd", lr=10.0)
    (flag,) = report.flag("summed-loss")
    assert flag.severity == "error" and f"scaled as the loss is, {per:.4g}" in flag.message, flag.message
    assert "fits this batch down to that floor" in flag.message and "--steps" not in flag.message
    assert math.isclose(flag.data["replay"]["losses"][0], replayed[0], rel_tol=1e-4)

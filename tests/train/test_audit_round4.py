"""Audit round 4: fourteen "my loss won't fall" bugs, three traps and six healthy models.

Every case's truth is measured first with a plain torch loop (same optimizer, lr, steps and batch):
does the loss fall, which parameters never change. Then layerlab's verdict is checked against it: the
finding, the module or parameter it names, and the cause/fix it gives. Traps (shuffled labels,
log_softmax + CrossEntropyLoss, a ReZero gate at 0) and healthy models must pass with no error.

Known limits, tested as such: AdamW with weight_decay=1.0 still overfits one batch in 50 steps (the
one-batch check cannot see what it will do to a long run), so no error is right; a prediction detached
inside forward stops the run with a clear error, not a finding per module.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import layerlab
from layerlab.errors import CheckFailed, UsageError

from tests.train import audit_round4_models as M

pytestmark = pytest.mark.usefixtures("one_thread")

STEPS = 50


def _g(seed=1):
    return torch.Generator().manual_seed(seed)


def _plain(model, inputs, loss_fn, target, make_opt=None, lr=1e-2, steps=STEPS):
    """The truth: a plain torch loop on a copy. Returns the losses, the names of the registered parameters
    that never changed, and the trained copy."""
    model = copy.deepcopy(model).train()
    opt = make_opt(model) if make_opt else torch.optim.Adam(model.parameters(), lr=lr)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses = []
    torch.manual_seed(0)
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(*inputs), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    unchanged = {n for n, p in model.named_parameters() if torch.equal(p.detach(), before[n])}
    return losses, unchanged, model


def _errors(report):
    return {(f.code, f.where) for f in report.flags if f.severity == "error"}


def _flag(report, code, where):
    found = [f for f in report.flags if f.code == code and f.where == where]
    assert found, [(f.code, f.where, f.severity) for f in report.flags]
    return found[0]


def _cls(n=16, d=16, c=4):
    return torch.randn(n, d, generator=_g()), torch.randint(0, c, (n,), generator=_g(2))


# ---------------------------------------------------------------- squashed twice


def test_softmax_before_token_cross_entropy_is_double_softmax():
    torch.manual_seed(0)
    model = M.TokenTagger()
    ids, y = torch.randint(0, 20, (8, 6), generator=_g()), torch.randint(0, 5, (8, 6), generator=_g(2))
    losses, _, _ = _plain(model, (ids,), nn.CrossEntropyLoss(), y)
    assert losses[0] / losses[-1] < 2  # truth: falls a little and stalls
    report = layerlab.train_check(model, ids, loss=nn.CrossEntropyLoss(), target=y, steps=STEPS)
    assert not report.ok
    assert "softmax" in _flag(report, "double-softmax", "output").hint


def test_sigmoid_before_bce_with_logits_is_double_sigmoid():
    torch.manual_seed(0)
    model = M.MultiLabelSigmoid()
    x, y = torch.randn(16, 12, generator=_g()), torch.randint(0, 2, (16, 5), generator=_g(2)).float()
    losses, _, _ = _plain(model, (x,), nn.BCEWithLogitsLoss(), y)
    assert losses[0] / losses[-1] < 2
    report = layerlab.train_check(model, x, loss=nn.BCEWithLogitsLoss(), target=y, steps=STEPS)
    assert "double-sigmoid" in {c for c, _ in _errors(report)}


# ---------------------------------------------------------------- target in raw units (fixed in round 4)


def _prices():
    x = torch.randn(32, 8, generator=_g())
    return x, 2e5 + 5e4 * torch.randn(32, generator=_g(2))


def test_unnormalised_regression_target_is_named_with_the_fix():
    torch.manual_seed(0)
    model = M.PriceRegressor()
    x, y = _prices()
    losses, unchanged, _ = _plain(model, (x,), nn.MSELoss(), y, lr=1e-3)
    assert losses[0] / losses[-1] < 1.01 and not unchanged  # flat, though every parameter moves
    report = layerlab.train_check(model, x, loss=nn.MSELoss(), target=y, lr=1e-3, steps=STEPS)
    found = _flag(report, "target-scale", "(target)")
    assert found.severity == "error"
    assert "offset" in found.message and "standardise" in found.hint
    assert found.data["target_rms"] > 1e5 and found.data["prediction_rms"] < 10
    assert "target-scale" in _flag(report, "loss-flat", "(loss)").hint  # not "check the lr"


def test_normalised_target_is_not_called_a_scale_problem():
    torch.manual_seed(0)
    model = M.PriceRegressor()
    x, y = _prices()
    y = (y - y.mean()) / y.std()
    report = layerlab.train_check(model, x, loss=nn.MSELoss(), target=y, lr=1e-3, steps=STEPS)
    assert not [f for f in report.flags if f.code == "target-scale"]


# ---------------------------------------------------------------- gradients cut off


def test_everything_frozen_is_a_clear_error():
    torch.manual_seed(0)
    x, y = _cls(d=10, c=3)
    with pytest.raises(UsageError, match="requires grad"):
        layerlab.train_check(M.FrozenEverything(), x, loss=nn.CrossEntropyLoss(), target=y, steps=STEPS)


def test_no_grad_inside_forward_names_both_modules_and_why():
    torch.manual_seed(0)
    model = M.NoGradBlock()
    x, y = _cls(d=10, c=3)
    _, unchanged, _ = _plain(model, (x,), nn.CrossEntropyLoss(), y)
    assert {n.split(".")[0] for n in unchanged} == {"stem", "encoder"}
    report = layerlab.train_check(model, x, loss=nn.CrossEntropyLoss(), target=y, steps=STEPS)
    assert {("no-grad", "stem"), ("no-grad", "encoder")} <= _errors(report)
    assert "no_grad" in _flag(report, "no-grad", "encoder").message
    # stem ran with gradients on: its graph ends where it feeds encoder (round 4: said, not only ".detach()")
    assert "fed to encoder, which ran with gradients off" in _flag(report, "no-grad", "stem").message


def test_dot_data_cuts_the_backbone_off():
    torch.manual_seed(0)
    model = M.DotDataFeatures()
    x, y = _cls(d=10, c=3)
    _, unchanged, _ = _plain(model, (x,), nn.CrossEntropyLoss(), y)
    assert {n.split(".")[0] for n in unchanged} == {"backbone"}
    report = layerlab.train_check(model, x, loss=nn.CrossEntropyLoss(), target=y, steps=STEPS)
    assert ("no-grad", "backbone") in _errors(report)
    assert ".data" in _flag(report, "no-grad", "backbone").message


def test_detached_prediction_stops_with_a_clear_error():
    torch.manual_seed(0)
    x, y = _cls(d=10, c=3)
    with pytest.raises(CheckFailed, match="does not require grad") as info:
        layerlab.train_check(M.DetachedOutput(), x, loss=nn.CrossEntropyLoss(), target=y, steps=STEPS)
    assert "detached" in info.value.hint


# ---------------------------------------------------------------- parameters outside the registry (fixed)


def test_parameters_in_a_plain_list_get_the_parameterlist_fix():
    torch.manual_seed(0)
    model = M.ListOfTemperatures()
    x, y = _cls()
    losses, _, trained = _plain(model, (x,), nn.CrossEntropyLoss(), y)
    assert losses[0] / losses[-1] < 10  # truth: the optimizer never holds the gates (0.01 forever)
    assert all(torch.equal(g.detach(), torch.full((16,), 0.01)) for g in trained.gates)
    report = layerlab.train_check(model, x, loss=nn.CrossEntropyLoss(), target=y, steps=STEPS)
    found = _flag(report, "unregistered", "gates")
    assert found.severity == "error" and found.data["params"] == ["gates[0]", "gates[1]", "gates[2]"]
    # they already are nn.Parameters: "wrap it in nn.Parameter" was the round-3 (wrong) fix
    assert "nn.ParameterList" in found.hint and "wrap it in nn.Parameter" not in found.hint
    assert "list of Parameter" in found.message


# ---------------------------------------------------------------- no gradient signal arrives (fixed)


def test_residual_branch_times_a_constant_zero_is_named():
    torch.manual_seed(0)
    model = M.ResidualTimesZero()
    x, y = torch.randn(16, 12, generator=_g()), torch.randint(0, 4, (16,), generator=_g(2))
    losses, unchanged, _ = _plain(model, (x,), nn.CrossEntropyLoss(), y)
    assert losses[0] / losses[-1] > 10  # the loss still overfits: only the block is dead weight
    assert {n.split(".")[0] for n in unchanged} == {"block"}
    report = layerlab.train_check(model, x, loss=nn.CrossEntropyLoss(), target=y, steps=STEPS)
    found = _flag(report, "zero-grad", "block")
    assert found.severity == "error"
    assert "multiply by 0" in found.message and "nn.Parameter" in found.hint


def test_tanh_saturated_by_a_constant_init_is_named():
    torch.manual_seed(0)
    model = M.SaturatedTanh()
    x, y = torch.randn(16, 10, generator=_g()), torch.randint(0, 3, (16,), generator=_g(2))
    losses, unchanged, _ = _plain(model, (x,), nn.CrossEntropyLoss(), y)
    assert losses[0] / losses[-1] < 1.2
    assert unchanged == {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"}
    with torch.no_grad():  # the truth behind the cause: net.3's every output is exactly ±1
        h = model.net[:4](x)
    assert bool((h.abs() == 1).all())
    report = layerlab.train_check(model, x, loss=nn.CrossEntropyLoss(), target=y, steps=STEPS)
    for where in ("net.0", "net.2"):
        found = _flag(report, "zero-grad", where)
        assert found.severity == "error"
        assert "tanh" in found.message and "±1" in found.message and "at net.3" in found.message
        assert "constant 5" in found.message and "init" in found.hint


def test_rezero_gate_at_zero_is_not_a_zero_path():
    torch.manual_seed(0)
    model = M.ReZeroBlock()
    x, y = torch.randn(16, 12, generator=_g()), torch.randint(0, 4, (16,), generator=_g(2))
    _, unchanged, _ = _plain(model, (x,), nn.CrossEntropyLoss(), y)
    assert not unchanged  # the gate learns at step 0, the block from step 1
    report = layerlab.train_check(model, x, loss=nn.CrossEntropyLoss(), target=y, steps=STEPS)
    assert report.ok and not _errors(report)


# ---------------------------------------------------------------- other findings


def test_keep_prob_dropout_is_a_dropout_warning():
    torch.manual_seed(0)
    model = M.KeepProbDropout()
    x, y = torch.randn(32, 20, generator=_g()), torch.randint(0, 4, (32,), generator=_g(2))
    losses, _, _ = _plain(model, (x,), nn.CrossEntropyLoss(), y)
    assert losses[0] / losses[-1] < 2
    report = layerlab.train_check(model, x, loss=nn.CrossEntropyLoss(), target=y, steps=STEPS)
    assert "keep_prob" in _flag(report, "dropout-high", "net.2").hint


def test_lstm_read_at_the_cls_step_is_constant_output():
    torch.manual_seed(0)
    model = M.LSTMFirstStep()
    ids = torch.randint(2, 30, (16, 10), generator=_g())
    ids[:, 0] = 1
    ids[torch.arange(10)[None, :] >= torch.randint(4, 11, (16,), generator=_g(3))[:, None]] = 0
    y = torch.randint(0, 3, (16,), generator=_g(2))
    losses, _, _ = _plain(model, (ids,), nn.CrossEntropyLoss(), y)
    assert losses[0] / losses[-1] < 1.2
    report = layerlab.train_check(model, ids, loss=nn.CrossEntropyLoss(), target=y, steps=STEPS)
    assert "BOS" in _flag(report, "constant-output", "output").hint


def test_clip_by_value_at_1e_8_is_step_shrunk():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    x, y = _cls()
    make = lambda m: M.ClipValueSGD(m.parameters(), lr=0.1, clip=1e-8)  # noqa: E731
    losses, _, _ = _plain(model, (x,), nn.CrossEntropyLoss(), y, make_opt=make)
    assert abs(losses[0] - losses[-1]) < 1e-4
    report = layerlab.train_check(model, x, loss=nn.CrossEntropyLoss(), target=y, optimizer=make, steps=STEPS)
    assert ("step-shrunk", "optimizer") in _errors(report)


def test_adamw_weight_decay_one_still_overfits_one_batch():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    x, y = _cls()
    make = lambda m: torch.optim.AdamW(m.parameters(), lr=3e-2, weight_decay=1.0)  # noqa: E731
    losses, _, _ = _plain(model, (x,), nn.CrossEntropyLoss(), y, make_opt=make)
    assert losses[0] / losses[-1] > 10  # the truth: one batch is still memorised
    report = layerlab.train_check(model, x, loss=nn.CrossEntropyLoss(), target=y, optimizer=make, steps=STEPS)
    assert report.ok and report.fit.verdict == "overfits"


# ---------------------------------------------------------------- traps and healthy models: no error


def test_shuffled_labels_are_memorised_and_not_flagged():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    x, y = _cls()
    y = y[torch.randperm(16, generator=_g(5))]
    report = layerlab.train_check(model, x, loss=nn.CrossEntropyLoss(), target=y, steps=STEPS)
    assert report.ok and report.fit.verdict == "overfits" and not _errors(report)


def test_log_softmax_before_cross_entropy_is_not_double_softmax():
    torch.manual_seed(0)
    model = M.LogSoftmaxHead()
    x, y = _cls()
    z = torch.randn(4, 5)  # log_softmax is idempotent: cross_entropy sees the same log-probabilities
    torch.testing.assert_close(F.log_softmax(F.log_softmax(z, -1), -1), F.log_softmax(z, -1))
    report = layerlab.train_check(model, x, loss=nn.CrossEntropyLoss(), target=y, steps=STEPS)
    assert report.ok and not _errors(report)


def _healthy(name):
    torch.manual_seed(0)
    if name == "cnn":
        return M.SmallCNN(), (torch.randn(8, 3, 16, 16, generator=_g()),), torch.randint(0, 5, (8,), generator=_g(2))
    if name == "gru":
        return M.GRUClassifier(), (torch.randint(0, 40, (16, 12), generator=_g()),), \
            torch.randint(0, 3, (16,), generator=_g(2))
    if name == "transformer":
        return M.TransformerRegressor(), (torch.randn(8, 10, 6, generator=_g()),), torch.randn(8, generator=_g(2))
    x, y = _cls()
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)), (x,), y


@pytest.mark.parametrize("name,loss", [
    ("mlp", nn.CrossEntropyLoss()), ("mlp", nn.CrossEntropyLoss(label_smoothing=0.1)),
    ("cnn", nn.CrossEntropyLoss()), ("gru", nn.CrossEntropyLoss()), ("transformer", nn.MSELoss())])
def test_healthy_models_pass(name, loss):
    model, inputs, y = _healthy(name)
    report = layerlab.train_check(model, *inputs, loss=loss, target=y, steps=STEPS)
    assert report.ok and report.fit.verdict == "overfits", [(f.code, f.where, f.message) for f in report.flags]


def test_healthy_bert_from_a_config_passes():
    transformers = pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=32, num_labels=3)
    model = transformers.BertForSequenceClassification(cfg)
    ids, y = torch.randint(0, 64, (8, 12), generator=_g()), torch.randint(0, 3, (8,), generator=_g(2))
    report = layerlab.train_check(model, ids, loss="model", forward_kwargs={"labels": y}, steps=STEPS)
    assert report.ok and report.fit.verdict == "overfits" and not _errors(report)

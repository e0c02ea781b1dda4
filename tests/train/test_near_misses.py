"""Near misses for train-check's findings: a model that looks like a finding's planted bug to its rule,
but is healthy (no finding may fire) or is broken for another reason (the right finding must).

Every healthy case is first trained with a plain torch loop (same optimizer, lr, steps, batch) to show
that the loss falls and every trainable parameter moves; train-check's first loss must equal it.
"""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import layerlab
from tests.train import near_miss_models as M

STEPS = 50
X = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
Y4 = torch.arange(16) % 4


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _plain(model, x, loss, target, make_opt, steps=STEPS):
    """The truth: a plain torch loop on a copy. Returns (losses, names of trainable params that never moved)."""
    m = copy.deepcopy(model)
    opt = make_opt(m)
    before = {n: p.detach().clone() for n, p in m.named_parameters() if p.requires_grad}
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        out = m(x)
        value = out["loss"] if loss is None else loss(out, target)
        value.backward()
        opt.step()
        losses.append(value.item())
    stuck = [n for n, p in m.named_parameters() if n in before and torch.equal(p, before[n])]
    return losses, stuck


def _adam(lr=1e-2, wd=0.0, cls=torch.optim.Adam):
    return lambda m: cls(m.parameters(), lr=lr, weight_decay=wd)


def _ids(shape, high, seed, low=0):
    return torch.randint(low, high, shape, generator=_gen(seed))


def _padded():
    ids = _ids((16, 6), 20, 4, low=1)
    ids[:, 4:] = 0  # the last two positions are padding_idx in every sample
    return ids


def _shifted_lm_loss(out, ids):
    return F.cross_entropy(out[:, :-1].reshape(-1, out.shape[-1]), ids[:, 1:].reshape(-1))


def _const_column():
    x = X.clone()
    x[:, 0] = 1.0  # a bias feature: the same for every sample, the other columns differ
    return x


class _MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


# name → (model factory, input, loss (None: the model's own), target, optimizer factory, warnings allowed)
HEALTHY = {
    # a ReLU dead for ~95 % of its (sample, unit) pairs but alive for some: not dead-relu / zero-grad
    "mostly-dead-relu": (lambda: M.MostlyDeadReLUModule(-0.9), X, F.cross_entropy, Y4, _adam(), ()),
    # a LayerScale gate initialised at 0: the branch's gradient is 0 at step 0 only
    "layerscale-gate-at-0": (M.LayerScale, X, F.cross_entropy, Y4, _adam(), ()),
    # softmax probabilities read by NLL on their log: not a double softmax
    "softmax-then-nll-of-log": (M.SoftmaxProbs, X, M.nll_of_log, Y4, _adam(), ()),
    # a sigmoid output against a target in [0, 1]: not output-range
    "sigmoid-target-in-0-1": (M.SigmoidRegressor, X, F.mse_loss, torch.rand(16, 3, generator=_gen(2)), _adam(), ()),
    # a Linear bias before BatchNorm: its gradient is cancelled by the batch mean, but not exactly 0
    "bias-before-batchnorm": (M.BNCancelsBias, X, F.cross_entropy, Y4, _adam(), ()),
    # an Embedding with padding_idx and padded inputs: not no-signal
    "padding-idx": (M.PaddedEmbedding, _padded(), F.cross_entropy, torch.arange(16) % 3, _adam(), ()),
    # a model whose loss reads both of its heads: not unread-output / wrong-output
    "two-heads-one-loss": (M.TwoHeadsOwnLoss, X, None, None, _adam(), ()),
    # a last layer initialised at 0: the first layer's gradient is 0 at step 0 only
    "zero-init-head-sgd": (M.ZeroInitHead, X, F.cross_entropy, Y4, _adam(0.5, cls=torch.optim.SGD), ()),
    # tanh saturated for most inputs (weights ×8) but not all: not a saturated-tanh zero path
    "mostly-saturated-tanh": (M.MostlySaturatedTanh, X, F.cross_entropy, Y4, _adam(), ()),
    # usual weight decay: not weight-decay
    "adamw-weight-decay-0.01": (_MLP, X, F.cross_entropy, Y4, _adam(1e-2, 0.01, torch.optim.AdamW), ()),
    "sgd-weight-decay-5e-4": (_MLP, X, F.cross_entropy, Y4, _adam(0.1, 5e-4, torch.optim.SGD), ()),
    # label smoothing: its loss floor is above 0, the fall is measured down to it
    "label-smoothing-0.1": (_MLP, X, nn.CrossEntropyLoss(label_smoothing=0.1), Y4, _adam(), ()),
    # a constant input column beside differing ones: not constant-output
    "constant-feature-column": (_MLP, _const_column(), F.cross_entropy, Y4, _adam(), ()),
    # a Gaussian NLL with a learned variance goes below 0 legitimately: not loss-negative
    "gaussian-nll-below-0": (M.GaussianNLL, X, M.gaussian_nll, 0.1 * torch.randn(16, generator=_gen(8)), _adam(), ()),
    # -inf in a causal attention mask before softmax: not nonfinite
    "masked-attention-minus-inf": (M.MaskedAttention, torch.randn(4, 6, 8, generator=_gen(9)), F.mse_loss,
                                   torch.randn(4, 6, 4, generator=_gen(10)), _adam(), ()),
    # clip_grad_norm_(1.0) on gradients of norm ~30: shrunk ~30×, not step-shrunk
    "clip-grad-norm-1": (_MLP, X, F.mse_loss, 5 * torch.randn(16, 4, generator=_gen(13)),
                         lambda m: M.ClipNormSGD(m.parameters(), lr=0.1), ()),
    # a summed loss under SGD at a small lr that trains: not summed-loss
    "sum-loss-small-lr": (_MLP, X, nn.CrossEntropyLoss(reduction="sum"), Y4, _adam(0.01, cls=torch.optim.SGD), ()),
    # an embedding frozen by design: a warning only
    "frozen-pretrained-embedding": (M.FrozenEmbedding, _ids((16, 5), 20, 3), F.cross_entropy, torch.arange(16) % 3,
                                    _adam(), ("requires-grad-false",)),
    # weights tied in __init__ and a loss that shifts the input ids itself: target=ids is right here
    "tied-lm-shifting-loss": (M.TiedLM, _ids((4, 8), 30, 5), _shifted_lm_loss, None, _adam(), ()),
}


@pytest.mark.parametrize("name", list(HEALTHY))
def test_near_miss_is_not_flagged(name, one_thread):
    make, x, loss, target, make_opt, allowed = HEALTHY[name]
    if name == "tied-lm-shifting-loss":
        target = x  # the loss shifts: the target is the input itself
    torch.manual_seed(0)
    model = make()
    losses, stuck = _plain(model, x, loss, target, make_opt)
    assert losses[-1] < 0.8 * losses[0] and not stuck, (losses[0], losses[-1], stuck)  # the truth: it trains
    kwargs = {"loss": loss, "target": target} if loss is not None else {}
    report = layerlab.train_check(model, x, optimizer=make_opt, steps=STEPS, **kwargs)
    assert report.losses[0] == pytest.approx(losses[0], rel=1e-5)  # the same run as the plain loop
    assert report.ok and report.fit.verdict in ("overfits", "falls"), [(f.code, f.message) for f in report.flags]
    assert {f.code for f in report.flags} <= set(allowed), [(f.code, f.where) for f in report.flags]


def test_dead_functional_relu_is_named_and_not_called_constant_output(one_thread):
    """Broken, but as a dead ReLU: a torch.relu whose input a bias of -10 makes negative everywhere. The prediction is
    the same for every sample because of it, not because the model ignores its inputs."""
    torch.manual_seed(0)
    model = M.DeadFunctionalReLU()
    losses, stuck = _plain(model, X, F.cross_entropy, Y4, _adam())
    assert abs(losses[-1] - losses[0]) < 1e-2 and set(stuck) == {"a.weight", "a.bias", "b.weight"}
    report = layerlab.train_check(model, X, loss=F.cross_entropy, target=Y4, steps=STEPS)
    codes = {(f.code, f.where): f for f in report.flags}
    assert not report.ok and "constant-output" not in {f.code for f in report.flags}
    first = codes[("zero-grad", "a")]
    assert first.severity == "error" and "relu whose every output is 0" in first.message
    assert "dead relu" in first.hint
    after = codes[("zero-grad", "b")]  # b.weight reads only the dead relu's zeros: not "this batch's" doing
    assert "dead relu" in after.message and "once its input is not all 0" not in after.hint


def test_raw_target_beside_a_dead_relu_is_not_blamed_on_the_target(one_thread):
    """A target in raw units (≈ 50) and a dead ReLU: the ReLU is why nothing learns; standardising the
    target alone would not make it fit, so target-scale is only a warning."""
    torch.manual_seed(0)
    model = M.MostlyDeadReLUModule(-10.0)
    target = 50 + 20 * torch.randn(16, 4, generator=_gen(11))
    losses, stuck = _plain(model, X, F.mse_loss, target, _adam())
    assert losses[-1] > 0.9 * losses[0] and "a.weight" in stuck and "b.weight" in stuck
    standardised = (target - target.mean()) / target.std()
    fit_std, _ = _plain(model, X, F.mse_loss, standardised, _adam())
    assert fit_std[-1] > fit_std[0] / 10  # standardised, it still does not overfit: the target is not the cause
    report = layerlab.train_check(model, X, loss=F.mse_loss, target=target, steps=STEPS)
    by_code = {f.code: f for f in report.flags}
    assert by_code["dead-relu"].severity == "error" and by_code["target-scale"].severity == "warning"
    assert "dead-relu act" in by_code["target-scale"].message


def test_raw_target_alone_is_still_target_scale(one_thread):
    """The planted case it was written for, kept: a healthy model, a target of order 2e5."""
    torch.manual_seed(0)
    model = _MLP()
    target = 2e5 + 3e4 * torch.randn(16, 4, generator=_gen(11))
    report = layerlab.train_check(model, X, loss=F.mse_loss, target=target, steps=STEPS, lr=1e-3)
    assert [f.severity for f in report.flags if f.code == "target-scale"] == ["error"]


def test_unshifted_target_through_a_user_loss_still_warns(one_thread):
    """The same tied LM with a user loss that does NOT shift: target=ids is the copy slip, and warned."""
    torch.manual_seed(0)
    model, ids = M.TiedLM(), _ids((4, 8), 30, 5)
    report = layerlab.train_check(model, ids, loss=lambda o, t: F.cross_entropy(o.flatten(0, 1), t.flatten()),
                                  target=ids, steps=STEPS)
    assert [f.severity for f in report.flags if f.code == "target-is-input"] == ["warning"]


def _separable():
    """A linear classifier that already separates its batch with margin: hinge loss exactly 0."""
    w_true = torch.randn(8, 3, generator=_gen(2))
    y = (X @ w_true).argmax(1)
    model = nn.Linear(8, 3)
    with torch.no_grad():
        model.weight.copy_(10 * w_true.T)
        model.bias.zero_()
    return model, y


def test_a_margin_loss_already_at_zero_is_not_called_masked(one_thread):
    """Near miss for no-signal: the loss is exactly 0 with no gradient because every sample already
    satisfies the margin, not because a mask removes every element."""
    model, y = _separable()
    assert F.multi_margin_loss(model(X), y).item() == 0.0  # the truth: at the floor before any step
    assert F.multi_margin_loss(torch.zeros(16, 3), y).item() > 0  # and the loss does read the prediction
    report = layerlab.train_check(model, X, loss=F.multi_margin_loss, target=y, steps=STEPS)
    assert report.ok and "no-signal" not in {f.code for f in report.flags}
    assert [f.severity for f in report.flags if f.code == "already-fit"] == ["warning"]


def test_a_loss_whose_mask_removes_everything_is_still_no_signal(one_thread):
    """The planted case, kept: a masked MSE whose mask is all 0 gives 0 for any prediction."""
    torch.manual_seed(0)
    target = torch.randn(16, 4, generator=_gen(3))
    mask = torch.zeros(16, 4)

    def masked_mse(p, t):
        return ((p - t) ** 2 * mask).sum() / mask.sum().clamp(min=1)

    report = layerlab.train_check(_MLP(), X, loss=masked_mse, target=target, steps=STEPS)
    assert [f.severity for f in report.flags if f.code == "no-signal"] == ["error"]


class _Bounded(nn.Module):
    def __init__(self, last):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2), last)

    def forward(self, x):
        return self.net(x)


def test_hardtanh_with_a_wider_range_than_the_target_is_not_output_range(one_thread):
    """Near miss for output-range: Hardtanh(-2, 2) against a target in [-1.5, 1.5] is reachable (it
    used to be read as ReLU6's [0, 6], so every negative target value counted as out of range)."""
    torch.manual_seed(0)
    model = _Bounded(nn.Hardtanh(-2.0, 2.0))
    target = 3 * torch.rand(16, 2, generator=_gen(30)) - 1.5
    losses, stuck = _plain(model, X, F.mse_loss, target, _adam())
    assert losses[-1] < losses[0] / 10 and not stuck  # the truth: it overfits
    report = layerlab.train_check(model, X, loss=F.mse_loss, target=target, steps=STEPS)
    assert report.ok and not report.flags, [(f.code, f.message) for f in report.flags]


def test_hardtanh_is_named_with_its_own_range(one_thread):
    """Broken as output-range: the default Hardtanh (-1, 1) against a target of std 3, said with (-1, 1)."""
    torch.manual_seed(0)
    model = _Bounded(nn.Hardtanh())
    target = 3 * torch.randn(16, 2, generator=_gen(31))
    floor = F.mse_loss(target.clamp(-1, 1), target).item()
    report = layerlab.train_check(model, X, loss=F.mse_loss, target=target, steps=STEPS)
    found, = report.flag("output-range")
    assert found.severity == "error" and "(-1, 1)" in found.message
    assert found.data["floor"] == pytest.approx(floor, rel=1e-5)
    assert report.losses[-1] >= floor * 0.999  # the truth: the run never gets below that floor

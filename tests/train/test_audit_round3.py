"""Audit round 3: thirteen training bugs of kinds earlier rounds did not try, and seven healthy models.

The truth of every case is measured here with a plain torch loop (the same optimizer, steps and batch)
before layerlab's verdict is checked against it: the finding, the module or parameter it names, and the
fix it gives. A healthy model must pass with no error. Known miss, not tested: an Embedding whose
padding_idx is a real, frequent token (its row never trains) is not flagged — random token ids put the
pad id mid-sequence too, so the sign that tells them apart is not in one batch.
"""

import copy
import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import layerlab
from layerlab.errors import UsageError

from tests.train import audit_round3_models as M

pytestmark = pytest.mark.usefixtures("one_thread")

STEPS = 30


def _x(shape, seed=1):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _ids(shape, high, seed=2):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def _plain(model, inputs, loss_fn, target, make_opt, steps=STEPS, **kwargs):
    """The truth: a plain torch loop on a copy. Returns the losses and each parameter before/after."""
    model = copy.deepcopy(model)
    opt = make_opt(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        out = model(*inputs, **kwargs)
        loss = out.loss if loss_fn is None else loss_fn(out, target)
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            break
        loss.backward()
        opt.step()
    after = {n: p.detach().clone() for n, p in model.named_parameters()}
    return losses, before, after, opt


def _codes(report, severity="error"):
    return {f.code: f for f in report.flags if f.severity == severity}


def _mlp_case():
    torch.manual_seed(0)
    return M.MLP(), _x((16, 16)), _ids((16,), 4)


# -- bugs ----------------------------------------------------------------------------------------------
def test_optimizer_built_on_a_model_that_was_then_recreated():
    torch.manual_seed(0)
    old = M.MLP()
    model, x, y = M.MLP(), _x((16, 16)), _ids((16,), 4)
    opt = torch.optim.Adam(old.parameters(), lr=1e-2)
    losses, before, after, _ = _plain(model, (x,), F.cross_entropy, y, lambda m: torch.optim.Adam(old.parameters()))
    assert losses[0] == losses[-1] and all(torch.equal(before[n], after[n]) for n in before)  # nothing trains
    with pytest.raises(UsageError, match="another instance of the model") as info:
        layerlab.train_check(model, x, loss=F.cross_entropy, target=y, optimizer=opt, steps=STEPS)
    assert "body.weight" in str(info.value) and "model.parameters()" in info.value.hint


def test_huge_weight_decay_on_layernorm_and_biases_names_them():
    torch.manual_seed(0)
    model, x, y = M.NormMLP(), _x((16, 16)), _ids((16,), 4)
    losses, before, after, _ = _plain(model, (x,), F.cross_entropy, y, M.norm_bias_decay, steps=50)
    assert after["norm.weight"].norm() < 0.2 * before["norm.weight"].norm()  # the decay wins
    assert losses[0] / losses[-1] < 10  # and the batch is not overfit
    report = layerlab.train_check(model, x, loss=F.cross_entropy, target=y, optimizer=M.norm_bias_decay, steps=50)
    decay = _codes(report)["weight-decay"]
    assert "norm.weight" in decay.data["params"] and "body.weight" not in decay.data["params"]
    assert "norm weights and biases" in decay.hint and not report.ok


def test_adam_lr_fine_for_sgd_is_unstable_even_though_the_loss_reaches_zero():
    model, x, y = _mlp_case()
    losses, before, after, _ = _plain(model, (x,), F.cross_entropy, y, lambda m: torch.optim.Adam(m.parameters(), 1.0))
    assert after["head.weight"].norm() > 10 * before["head.weight"].norm()  # the weights blow up …
    assert losses[-1] < losses[0] / 10  # … and the loss still falls (huge logits)
    report = layerlab.train_check(model, x, loss=F.cross_entropy, target=y, optimizer="adam", lr=1.0, steps=STEPS)
    unstable = _codes(report)["unstable"]
    assert not report.ok and "lower --lr" in unstable.hint
    assert "large-first-step" not in _codes(report, "warning")
    # the default lr on the same model is healthy
    assert layerlab.train_check(model, x, loss=F.cross_entropy, target=y, steps=STEPS).ok


def test_a_layer_scale_at_1e_6_with_your_sane_adam_lr_is_not_unstable():
    class Scaled(nn.Module):  # ConvNeXt's layer scale: x + γ·f(x), γ initialised to 1e-6
        def __init__(self, d=16):
            super().__init__()
            self.f = nn.Linear(d, d)
            self.gamma = nn.Parameter(torch.full((d,), 1e-6))

        def forward(self, x):
            return x + self.gamma * torch.relu(self.f(x))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), Scaled(), Scaled(), nn.Linear(16, 4))
    x, y = _x((16, 16)), _ids((16,), 4)
    losses, before, after, _ = _plain(model, (x,), F.cross_entropy, y, lambda m: torch.optim.Adam(m.parameters(), 1e-2))
    assert losses[-1] < losses[0] / 10 and after["1.gamma"].abs().max() > 1e3 * before["1.gamma"].abs().max()
    for lr in (1e-2, 1e-3):  # 1e-3: the loss only falls in these steps, and γ still moves ×1000 on step 1
        report = layerlab.train_check(model, x, loss=F.cross_entropy, target=y, optimizer="adam", lr=lr, steps=STEPS)
        assert report.ok and "unstable" not in {f.code for f in report.flags}, [(f.code, f.where) for f in report.flags]
        assert _codes(report, "warning")["large-first-step"].data["modules"] == ["1", "2"]
    assert report.fit.verdict != "overfits" and report.losses[-1] < report.losses[0]


def test_gradient_clipped_to_1e_6_is_not_told_to_raise_the_lr():
    model, x, y = _mlp_case()
    make = lambda m: M.ClippedSGD(m.parameters(), lr=0.1)  # noqa: E731
    losses, *_ = _plain(model, (x,), F.cross_entropy, y, make)
    assert abs(losses[0] - losses[-1]) < 1e-4
    report = layerlab.train_check(model, x, loss=F.cross_entropy, target=y, optimizer=make, steps=STEPS)
    errors = _codes(report)
    assert errors["step-shrunk"].data["actual"] < 1e-3 * errors["step-shrunk"].data["expected"]
    assert "clip" in errors["step-shrunk"].message
    assert all("raise --lr" not in f.hint for f in report.flags)
    # plain SGD at the same lr: no step-shrunk
    plain = layerlab.train_check(model, x, loss=F.cross_entropy, target=y, optimizer="sgd", lr=0.1, steps=STEPS)
    assert "step-shrunk" not in {f.code for f in plain.flags}


def test_frozen_head_instead_of_backbone_is_named():
    model, x, y = _mlp_case()
    model.head.requires_grad_(False)
    make = lambda m: torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=1e-2)  # noqa: E731
    _, before, after, _ = _plain(model, (x,), F.cross_entropy, y, make)
    assert torch.equal(before["head.weight"], after["head.weight"])
    report = layerlab.train_check(model, x, loss=F.cross_entropy, target=y, steps=STEPS)
    assert _codes(report, "warning")["requires-grad-false"].where == "head"


def test_zero_grad_never_called_is_an_error_even_when_the_loss_falls():
    model, x, y = _mlp_case()
    make = lambda m: M.NoZeroSGD(m.parameters(), lr=0.1)  # noqa: E731
    losses, _, _, opt = _plain(model, (x,), F.cross_entropy, y, make)
    opt.zero_grad()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in opt.param_groups[0]["params"])
    report = layerlab.train_check(model, x, loss=F.cross_entropy, target=y, optimizer=make, steps=STEPS)
    accumulate = _codes(report)["grads-accumulate"]
    assert not report.ok and accumulate.data["step"] == 1 and "zero_grad" in accumulate.hint
    ok = layerlab.train_check(model, x, loss=F.cross_entropy, target=y, optimizer="sgd", lr=0.1, steps=STEPS)
    assert "grads-accumulate" not in {f.code for f in ok.flags}


@pytest.mark.parametrize("last, loss, code", [
    (nn.Softmax(dim=-1), lambda p, t: F.cross_entropy(p, t), "double-softmax"),
    (nn.Sigmoid(), lambda p, t: F.binary_cross_entropy_with_logits(p, t), "double-sigmoid"),
])
def test_squash_before_a_loss_that_applies_it_given_as_your_own_function(last, loss, code):
    torch.manual_seed(0)
    model, x = M.squashed_classifier(last), _x((16, 16))
    y = _ids((16,), 4) if code == "double-softmax" else _ids((16, 4), 2).float()
    losses, *_ = _plain(model, (x,), loss, y, lambda m: torch.optim.Adam(m.parameters(), 1e-2))
    assert losses[-1] > losses[0] / 3  # stalls far above 0
    report = layerlab.train_check(model, x, loss=loss, target=y, steps=STEPS)
    assert _codes(report)[code].where == "3"
    # the same loss on raw scores is not flagged
    torch.manual_seed(0)
    raw = M.squashed_classifier(nn.Identity())
    assert code not in {f.code for f in layerlab.train_check(raw, x, loss=loss, target=y, steps=STEPS).flags}


def test_causal_lm_trained_on_unshifted_labels_warns_that_it_only_copies():
    torch.manual_seed(0)
    model, ids = M.TinyCausalLM(), _ids((8, 12), 20, 3)
    losses, *_ = _plain(model, (ids,), F.cross_entropy, ids, lambda m: torch.optim.Adam(m.parameters(), 1e-2))
    assert losses[-1] < losses[0] / 10  # the copy task is trivial
    report = layerlab.train_check(model, ids, loss=F.cross_entropy, target=ids, steps=STEPS)
    warning = _codes(report, "warning")["target-is-input"]
    assert report.ok and warning.data["input"] and "ids[:, 1:]" in warning.hint
    shifted = layerlab.train_check(model, ids, loss=F.cross_entropy, target=torch.roll(ids, -1, 1), steps=STEPS)
    assert "target-is-input" not in {f.code for f in shifted.flags}


def test_tie_broken_after_the_optimizer_was_built_leaves_the_head_untrained():
    torch.manual_seed(0)
    model, ids = M.TiedLM(), _ids((8, 12), 20, 3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.head.weight = nn.Parameter(model.emb.weight.detach().clone())  # "untie" after the optimizer exists
    target = torch.roll(ids, -1, 1)
    _, before, after, _ = _plain(model, (ids,), F.cross_entropy, target, lambda m: torch.optim.Adam(
        [p for p in m.parameters() if p is not m.head.weight], lr=1e-2))
    assert torch.equal(before["head.weight"], after["head.weight"])
    report = layerlab.train_check(model, ids, loss=F.cross_entropy, target=target, optimizer=opt, steps=STEPS)
    assert _codes(report)["not-in-optimizer"].where == "head"


def test_summed_cross_entropy_with_label_smoothing_is_named_as_the_cause():
    torch.manual_seed(0)
    model, x, y = M.MLP(), _x((128, 16)), _ids((128,), 4)
    make = lambda m: torch.optim.SGD(m.parameters(), lr=1.0)  # noqa: E731
    summed, *_ = _plain(model, (x,), M.smoothed_ce_sum, y, make)
    mean, *_ = _plain(model, (x,), M.smoothed_ce, y, make)
    assert not math.isfinite(summed[-1]) and math.isfinite(mean[-1]) and mean[-1] < mean[0]
    report = layerlab.train_check(model, x, loss=M.smoothed_ce_sum, target=y, optimizer="sgd", lr=1.0, steps=STEPS)
    found = _codes(report)["summed-loss"]
    assert found.data["count"] == 128 and "label_smoothing" in found.message and "reduction='mean'" in found.hint
    # the mean loss is not read as summed
    mean_report = layerlab.train_check(model, x, loss=M.smoothed_ce, target=y, optimizer="sgd", lr=1.0, steps=STEPS)
    assert "summed-loss" not in {f.code for f in mean_report.flags}


def test_optimizer_factory_on_a_consumed_parameters_generator_is_a_clear_error():
    model, x, y = _mlp_case()

    def factory(m):
        params = m.parameters()
        print(sum(p.numel() for p in params))  # the generator is used up here
        return torch.optim.Adam(params, lr=1e-2)

    with pytest.raises(ValueError, match="empty parameter list"):
        factory(copy.deepcopy(model))
    with pytest.raises(UsageError, match="factory raised ValueError: optimizer got an empty") as info:
        layerlab.train_check(model, x, loss=F.cross_entropy, target=y, optimizer=factory, steps=STEPS)
    assert "list(model.parameters())" in info.value.hint


# -- healthy: no error, and the loss falls as plain torch says ----------------------------------------
def _healthy(model, inputs, loss, target, **kwargs):
    losses, *_ = _plain(model, inputs, loss, target, lambda m: torch.optim.Adam(m.parameters(), 1e-2), **kwargs)
    assert losses[-1] < losses[0] / 3, losses  # the truth: it trains
    args = {} if loss is None else {"loss": loss, "target": target}
    report = layerlab.train_check(model, *inputs, steps=STEPS, **args, **kwargs)
    assert report.ok and not _codes(report), [(f.code, f.message) for f in report.flags]
    assert report.fit.verdict in ("overfits", "falls")
    return report


def test_healthy_transformer_encoder_classifier():
    torch.manual_seed(0)
    _healthy(M.TransformerClassifier(), (_ids((8, 10), 30, 3),), F.cross_entropy, _ids((8,), 4))


def test_healthy_lstm_tagger_with_class_dim_second():
    torch.manual_seed(0)
    _healthy(M.LSTMTagger(), (_ids((8, 7), 30, 3),), F.cross_entropy, _ids((8, 7), 5))


def test_healthy_cnn_with_batchnorm():
    torch.manual_seed(0)
    _healthy(M.bn_cnn(), (_x((8, 3, 8, 8)),), F.cross_entropy, _ids((8,), 4))


def test_healthy_label_smoothing_and_rezero():
    torch.manual_seed(0)
    x, y = _x((16, 16)), _ids((16,), 4)
    report = _healthy(M.MLP(), (x,), M.smoothed_ce, y)
    # the truth: the lowest loss any prediction reaches, found by optimising free logits in plain torch
    logits = torch.zeros(16, 4, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=0.1)
    for _ in range(500):
        opt.zero_grad()
        M.smoothed_ce(logits, y).backward()
        opt.step()
    lowest = M.smoothed_ce(logits, y).item()
    losses = report.losses
    assert (losses[0] - lowest) / (losses[-1] - lowest) >= 10  # it fits down to that floor …
    assert report.fit.verdict == "overfits"  # … and says so, naming that floor
    said = re.search(r"([0-9.]+) \(label_smoothing=0.1 over 4 classes\)", report.fit.message)
    assert said and abs(float(said.group(1)) - lowest) < 1e-3, report.fit.message
    torch.manual_seed(0)
    report = _healthy(M.ReZeroNet(), (_x((16, 16)),), F.cross_entropy, _ids((16,), 4))
    assert not report.flags  # α = 0 is not dead: no zero-grad, no warning


def test_healthy_hugging_face_bert_and_gpt2_with_labels():
    transformers = pytest.importorskip("transformers", reason="Hugging Face models need transformers")
    torch.manual_seed(0)
    bert = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=32, num_labels=3))
    _healthy(bert, (), None, None, input_ids=_ids((8, 10), 50, 3), labels=_ids((8,), 3))
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=50, n_embd=16, n_layer=2, n_head=2, n_positions=32, bos_token_id=0, eos_token_id=0))
    ids = _ids((4, 12), 50, 3)
    report = _healthy(gpt2, (), None, None, input_ids=ids, labels=ids)
    assert "target-is-input" not in {f.code for f in report.flags}


def test_sparse_embedding_with_sgd_trains_without_a_traceback_and_momentum_is_not_a_shrunk_step():
    class Bag(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = nn.Embedding(20, 8, sparse=True), nn.Linear(8, 4)

        def forward(self, ids):
            return self.head(self.emb(ids).mean(1))

    torch.manual_seed(0)
    model, ids, y = Bag(), _ids((8, 5), 20, 3), _ids((8,), 4)
    make = lambda m: torch.optim.SGD(m.parameters(), lr=0.5)  # noqa: E731
    losses, before, after, _ = _plain(model, (ids,), F.cross_entropy, y, make)
    assert losses[-1] < losses[0] and not torch.equal(before["emb.weight"], after["emb.weight"])
    report = layerlab.train_check(model, ids, loss=F.cross_entropy, target=y, optimizer=make, steps=STEPS)
    assert report.ok and not _codes(report) and report.groups[0].grad_norm[0] > 0
    model, x, y = _mlp_case()
    heavy = lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-2, dampening=0.5)  # noqa
    report = layerlab.train_check(model, x, loss=F.cross_entropy, target=y, optimizer=heavy, steps=STEPS)
    assert "step-shrunk" not in {f.code for f in report.flags} and report.ok

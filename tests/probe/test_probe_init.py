"""The init check: ``--probe init`` (the table) and its short form, on by default (findings only).

Every number is checked against real torch: the "torch default" std against a freshly reset copy,
Kaiming/Xavier against torch's own initialisers, the std by depth against the layers' outputs, the
zero-init stories against the gradients autograd gives.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import layerlab
from layerlab.layers import Linear as LayerlabLinear

INIT_CODES = {"zero-init", "init-normal", "forward-std-trend"}


def _init_findings(report):
    return [f for f in [*report.problems, *report.notes] if f.code in INIT_CODES or "init" in f.data]


def _mlp(depth=2, width=32, out=10):
    layers = []
    for i in range(depth):
        layers += [nn.Linear(16 if i == 0 else width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, out))


# -- zero init ---------------------------------------------------------------------------------------------

def test_a_zero_classifier_head_is_named_once_and_torch_agrees_nothing_upstream_learns_on_step_one():
    torch.manual_seed(0)
    model, x = _mlp(), torch.randn(8, 16)
    nn.init.zeros_(model[4].weight)
    # torch: the layers before the zero head get exactly zero gradient on the first step
    grads = torch.autograd.grad((model(x) * torch.randn(8, 10)).sum(), [model[0].weight, model[2].weight])
    assert all(not g.any() for g in grads)

    report = layerlab.inspect(model, x)  # the short form runs by default
    (finding,) = _init_findings(report)  # gradient_root's note, extended: not a second one
    assert finding.code == "zero-grad-root" and finding.severity == "info" and finding.where == "4"
    assert "4.weight is all zero" in finding.message and finding.data["init"] == {"zero": ["4.weight"]}
    assert report.warnings == []

    no_backward = layerlab.inspect(model, x, backward=False)  # no gradient_root without backward: our own note
    (finding,) = _init_findings(no_backward)
    assert finding.code == "zero-init" and finding.severity == "info" and finding.where == "4"
    assert finding.message.startswith("4.weight is all zero (zero-initialised): the gradient w.r.t. 4's input is "
                                      "exactly 0")
    assert "intended for residual branches and heads" in finding.message

    full = layerlab.inspect(model, x, probes=["init"])
    assert full.probe("init").row("4.weight").flags == ["zero"]
    assert len(_init_findings(full)) == 1  # the probe replaces the short form: nothing said twice


class _ZeroBranch(nn.Module):
    """A residual block whose branch ends in a zero conv (Fixup / ControlNet's zero convolution)."""

    def __init__(self, c):
        super().__init__()
        self.conv1, self.act, self.conv2 = nn.Conv2d(c, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1)
        nn.init.zeros_(self.conv2.weight), nn.init.zeros_(self.conv2.bias)

    def forward(self, x):
        return x + self.conv2(self.act(self.conv1(x)))


def test_zero_init_residual_branches_are_notes_that_do_not_claim_the_skip_path_starves():
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), _ZeroBranch(8), _ZeroBranch(8)), torch.randn(2, 3, 8, 8)
    # torch: the stem still learns through the skips; the branch's first conv gets nothing on step one
    stem, branch = torch.autograd.grad(model(x).pow(2).sum(), [model[0].weight, model[1].conv1.weight])
    assert stem.abs().sum() > 0 and not branch.any()

    report = layerlab.inspect(model, x, backward=False)  # our own notes (no gradient_root without backward)
    notes = [f for f in _init_findings(report) if f.code == "zero-init"]
    assert sorted(f.where for f in notes) == ["1.conv2", "2.conv2"] and report.warnings == []
    for f in notes:
        assert "nothing upstream" not in f.message
        assert "what reaches the loss only through it gets none (a skip connection around it" in f.message


def test_two_consecutive_zero_layers_are_a_warning_and_torch_agrees_neither_learns():
    torch.manual_seed(0)
    model, x = _mlp(), torch.randn(8, 16)
    nn.init.zeros_(model[2].weight), nn.init.zeros_(model[2].bias), nn.init.zeros_(model[4].weight)
    grads = torch.autograd.grad((model(x) * torch.randn(8, 10)).sum(), [model[2].weight, model[4].weight])
    assert all(not g.any() for g in grads)  # torch: neither zero layer gets a gradient

    for backward in (True, False):
        report = layerlab.inspect(model, x, backward=backward)
        (finding,) = [f for f in _init_findings(report) if "two consecutive zero layers" in f.message]
        assert finding.severity == "warning" and finding.where == "4"
        assert "2.weight, which feeds it an all-zero output, is all zero too" in finding.message
        assert sorted(finding.data.get("init", finding.data)["zero"]) == ["2.weight", "4.weight"]
        # 2.weight is told about with the layer it feeds, not on its own
        assert not [f for f in _init_findings(report) if f.where == "2"]


def test_a_frozen_zero_layer_is_a_warning():
    torch.manual_seed(0)
    model = _mlp()
    nn.init.zeros_(model[0].weight)
    model[0].weight.requires_grad_(False)
    (finding,) = _init_findings(layerlab.inspect(model, torch.randn(8, 16)))
    assert finding.code == "zero-init" and finding.severity == "warning" and "frozen" in finding.message


# -- N(0, 1) in a deep stack and the std by depth -------------------------------------------------------

def test_an_n01_initialised_20_layer_mlp_is_flagged_with_the_std_growing_by_depth():
    torch.manual_seed(0)
    model, x = _mlp(depth=20, width=64), torch.randn(8, 16)
    linears = [m for m in model if isinstance(m, nn.Linear)][:20]
    for layer in linears:
        nn.init.normal_(layer.weight, 0.0, 1.0)
    # the real output std of every Linear, measured with plain forward hooks
    measured = []
    handles = [m.register_forward_hook(lambda m, i, o: measured.append(float(o.detach().std(correction=0))))
               for m in model if isinstance(m, nn.Linear)]
    model(x)
    for h in handles:
        h.remove()

    report = layerlab.inspect(model, x)
    (normal,) = [f for f in report.problems if f.code == "init-normal"]
    assert normal.data["weights"] == [f"{2 * i}.weight" for i in range(20)]
    assert all(0.9 < s < 1.1 for s in normal.data["std"])
    (trend,) = [f for f in report.problems if f.code == "forward-std-trend"]
    stds = trend.data["std_by_depth"]
    assert stds == pytest.approx(measured, rel=1e-4)
    assert all(b > a for a, b in zip(stds[:20], stds[1:20]))  # grows at every N(0, 1) layer
    assert stds[19] / stds[0] > 1e10 and "grows layer over layer" in trend.message

    rows = layerlab.inspect(model, x, probes=["init"]).probe("init")
    assert [r.path for r in rows.rows if "N(0,1)" in r.flags] == normal.data["weights"]
    assert rows.row("std by depth").series["std_by_depth"] == pytest.approx(measured, rel=1e-4)


def test_gpt2_style_small_init_and_a_single_n01_layer_are_not_flagged():
    torch.manual_seed(0)
    model = _mlp(depth=6, width=64)
    for m in model:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
    nn.init.normal_(model[0].weight, 0.0, 1.0)  # one N(0, 1) layer is not a deep stack
    assert _init_findings(layerlab.inspect(model, torch.randn(8, 16))) == []


# -- the table: torch default, Kaiming, Xavier ---------------------------------------------------------

def _owners():
    return {
        "lin": nn.Linear(48, 24), "conv": nn.Conv2d(3, 8, 3), "convt": nn.ConvTranspose1d(4, 6, 5),
        "emb": nn.Embedding(30, 12), "lstm": nn.LSTM(12, 10), "mha": nn.MultiheadAttention(12, 3),
        "ll": LayerlabLinear(12, 7),
    }


class _Zoo(nn.Module):
    def __init__(self):
        super().__init__()
        for name, module in _owners().items():
            self.add_module(name, module)

    def forward(self, img, seq, ids):
        a = self.conv(img).mean()
        b = self.convt(seq).mean()
        e = self.emb(ids)  # (S, B, 12)
        h, _ = self.lstm(e)
        h, _ = self.mha(h, h, h)
        return self.ll(h).mean() + self.lin(torch.randn(2, 48)).mean() + a + b


def test_torch_default_std_is_that_of_a_freshly_reset_copy_and_the_weights_are_not_touched():
    torch.manual_seed(0)
    zoo = _Zoo()
    for p in zoo.parameters():  # far from any default, so a copied value would show
        nn.init.normal_(p, 0.0, 3.0)
    before = {n: p.detach().clone() for n, p in zoo.named_parameters()}
    inputs = (torch.randn(2, 3, 8, 8), torch.randn(2, 4, 7), torch.randint(0, 30, (5, 2)))
    result = layerlab.inspect(zoo, *inputs, probes=["init"], seed=3).probe("init")
    checked = 0
    for name, owner in zoo.named_children():
        reset = copy.deepcopy(owner)
        torch.manual_seed(3)  # the run's seed
        (reset.reset_parameters if hasattr(reset, "reset_parameters") else reset._reset_parameters)()
        for attr, p in reset.named_parameters(recurse=False):
            if "weight" in attr:
                assert result.row(f"{name}.{attr}").values["default"] == pytest.approx(
                    float(p.detach().double().std(correction=0)), rel=1e-12), f"{name}.{attr}"
                assert result.row(f"{name}.{attr}").values["std"] == pytest.approx(3.0, rel=0.2)
                checked += 1
    assert checked == 8  # lin, conv, convt, emb, ll, mha.in_proj_weight, lstm.weight_ih_l0 and weight_hh_l0
    out_proj = copy.deepcopy(zoo.mha.out_proj)
    torch.manual_seed(3)
    out_proj.reset_parameters()
    assert result.row("mha.out_proj.weight").values["default"] == pytest.approx(
        float(out_proj.weight.detach().double().std(correction=0)), rel=1e-12)
    assert all(torch.equal(before[n], p) for n, p in zoo.named_parameters())


def test_kaiming_and_xavier_are_the_stds_torch_initialisers_give_for_the_activation_that_follows():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.BatchNorm1d(512), nn.Dropout(0.1), nn.LeakyReLU(0.2),
                          nn.Linear(512, 384), nn.Tanh(), nn.Linear(384, 256))  # big enough: sampled stds within 1%
    rows = layerlab.inspect(model, torch.randn(8, 256), probes=["init"]).probe("init")
    for path, act, param in (("0", "leaky_relu", 0.2), ("4", "tanh", None), ("6", "linear", None)):
        row = rows.row(f"{path}.weight")
        shape = getattr(model, path).weight.shape
        kaiming = nn.init.kaiming_normal_(torch.empty(shape), a=param or 0, nonlinearity=act).std()
        xavier = nn.init.xavier_normal_(torch.empty(shape), gain=nn.init.calculate_gain(act, param)).std()
        assert row.values["kaiming"] == pytest.approx(float(kaiming), rel=0.02)
        assert row.values["xavier"] == pytest.approx(float(xavier), rel=0.02)
    assert [rows.row(f"{p}.weight").class_name for p in "046"] == ["Linear → LeakyReLU", "Linear → Tanh",
                                                                   "Linear → linear"]


def test_the_probe_leaves_the_global_rng_alone():
    model = _mlp()
    state = torch.get_rng_state()
    layerlab.inspect(model, torch.ones(2, 16), probes=["init"], seed=None)
    assert torch.equal(torch.get_rng_state(), state)


# -- no false alarms: stock torch layers and Hugging Face models ----------------------------------------

def test_torch_default_init_raises_nothing_on_the_stock_corpus():
    from tests.checks.stock_configs import ENTRIES

    for id_, build, inputs, kwargs, _ in ENTRIES:
        torch.manual_seed(0)
        report = layerlab.inspect(build(), *inputs(), **kwargs, probes=["init"])  # same findings as the short form
        assert _init_findings(report) == [], (id_, _init_findings(report))
        assert not [r for r in report.probe("init").rows if r.flags], id_


@pytest.mark.parametrize("probes", [None, ["init"]])
def test_hugging_face_gpt2_and_bert_raise_no_init_finding(probes):
    tf = pytest.importorskip("transformers", reason="transformers is not installed")
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (2, 12))
    for model in (tf.GPT2Model(tf.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100, n_positions=32)),
                  tf.BertModel(tf.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                             intermediate_size=64, vocab_size=100, max_position_embeddings=32))):
        report = layerlab.inspect(model.eval(), ids, probes=probes)
        assert _init_findings(report) == [], _init_findings(report)
        if probes:
            rows = report.probe("init").rows
            assert not [r for r in rows if r.flags]
            stds = [r.values["std"] for r in rows if r.path.endswith("weight") and "Norm" not in r.class_name
                    and r.values["std"] is not None]
            assert stds and all(0.005 < s < 0.025 for s in stds)  # HF's N(0, 0.02) (GPT-2's c_proj: 0.02/√(2·n_layer))

"""Training bugs from an independent audit (written without reading the other planted cases): each is
told apart by its flag, its module and the key advice; the healthy models beside them stay clean."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from layerlab.errors import CheckFailed, UsageError
from layerlab.train.run import train_check


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@pytest.fixture
def x():
    return torch.randn(16, 16, generator=torch.Generator().manual_seed(1))


def _mlp(out=4, tail=()):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, out), *tail)


def _flag(report, code):
    found = [f for f in report.flags if f.code == code]
    assert len(found) == 1, [(f.code, f.where, f.message) for f in report.flags]
    return found[0]


# -- a softmax/sigmoid before a loss that applies one itself -------------------------------------------

def test_softmax_module_before_cross_entropy_is_named(x):
    report = train_check(_mlp(tail=[nn.Softmax(dim=1)]), x, loss="cross_entropy")
    flag = _flag(report, "double-softmax")
    assert not report.ok and flag.severity == "error" and flag.where == "3"
    assert "cross_entropy applies a softmax itself" in flag.message
    assert flag.hint.startswith("drop the softmax and give cross_entropy the raw scores")
    # the floor the message claims, from torch: cross_entropy of probabilities ≥ log(1 + (C-1)/e), C = 4
    assert min(report.losses) > math.log(1 + 3 / math.e)
    assert "more steps will not help: double-softmax 3" in report.fit.message


def test_functional_softmax_through_a_squeeze_is_named_at_the_output(x):
    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = _mlp()

        def forward(self, x):
            return F.softmax(self.body(x).unsqueeze(-1), dim=1).squeeze(-1)

    flag = _flag(train_check(Head(), x, loss=nn.CrossEntropyLoss()), "double-softmax")
    assert flag.where == "output"  # F.softmax is no module: the output the loss reads is named


def test_sigmoid_before_bce_with_logits_is_named(x):
    report = train_check(_mlp(out=1, tail=[nn.Sigmoid()]), x, loss=nn.BCEWithLogitsLoss())
    flag = _flag(report, "double-sigmoid")
    assert not report.ok and flag.where == "3"
    assert flag.hint == "drop the sigmoid and give BCEWithLogitsLoss the raw scores, or keep it and use BCELoss"


@pytest.mark.parametrize("tail, loss", [((nn.LogSoftmax(dim=1),), "nll"), ((), "cross_entropy"),
                                        ((), nn.BCEWithLogitsLoss())], ids=["log_softmax-nll", "logits-ce",
                                                                            "logits-bce"])
def test_what_the_loss_wants_is_not_flagged(x, tail, loss):
    out = 1 if isinstance(loss, nn.BCEWithLogitsLoss) else 4
    report = train_check(_mlp(out=out, tail=tail), x, loss=loss)
    assert report.ok and report.flags == [], [(f.code, f.message) for f in report.flags]


def test_sigmoid_before_bce_loss_is_not_flagged(x):
    report = train_check(_mlp(out=1, tail=[nn.Sigmoid()]), x, loss=nn.BCELoss())
    assert report.ok and report.flags == []


# -- tensors the loss trains through that model.parameters() does not list -------------------------------

class PlainTensor(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(16, 32)
        self.w = torch.randn(32, 4, requires_grad=True)  # not an nn.Parameter
        self.scale = torch.tensor(2.0)  # a constant: not a lost parameter

    def forward(self, x):
        return torch.relu(self.l1(x)) @ self.w * self.scale


class PyList(nn.Module):
    def __init__(self, head=True):
        super().__init__()
        self.blocks = [nn.Linear(16, 16) for _ in range(3)]
        self.head = nn.Linear(16, 4) if head else None

    def forward(self, x):
        for b in self.blocks:
            x = torch.relu(b(x))
        return self.head(x) if self.head is not None else x


def test_plain_tensor_attribute_is_named_even_when_the_loss_overfits(x):
    torch.manual_seed(0)
    model = PlainTensor()
    assert all(p is not model.w for p in model.parameters())  # torch does not list it
    report = train_check(model, x)
    flag = _flag(report, "unregistered")
    assert not report.ok and flag.where == "w" and flag.data["params"] == ["w"]
    assert "not an nn.Parameter" in flag.message
    assert flag.hint == "wrap it in nn.Parameter(...) (or register_buffer(...) if it is not meant to train)"


def test_layers_in_a_python_list_are_named(x):
    torch.manual_seed(0)
    report = train_check(PyList(), x, loss="cross_entropy")
    flag = _flag(report, "unregistered")
    assert flag.where == "blocks" and len(flag.data["params"]) == 6
    assert flag.hint.startswith("hold the layers in nn.ModuleList")
    assert "more steps will not help: unregistered blocks" in report.fit.message
    slow = [f for f in report.flags if f.code in ("loss-slow",)]
    assert all(f.hint == "fix the errors below first" for f in slow)


def test_only_layers_in_a_python_list_is_a_clear_error(x):
    torch.manual_seed(0)
    with pytest.raises(UsageError, match="nothing to train") as info:
        train_check(PyList(head=False), x)
    assert info.value.hint.startswith("blocks hold(s) tensors or layers outside the model's registry")


# -- a backward that raises, a dead network, weight decay, a stale optimizer -----------------------------

def test_in_place_op_on_a_saved_tensor_is_a_clear_error(x):
    class Inplace(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2 = nn.Linear(16, 32), nn.Linear(32, 4)

        def forward(self, x):
            h = torch.sigmoid(self.l1(x))
            h.mul_(2)  # sigmoid saved its output for backward
            return self.l2(h)

    with pytest.raises(CheckFailed, match=r"backward failed at step 0: one of the variables needed for gradient "
                                          r"computation has been modified by an inplace operation") as info:
        train_check(Inplace(), x)
    assert info.value.hint.startswith("make the in-place op out-of-place")


def test_zero_initialised_mlp_is_told_from_a_negative_bias(x):
    zero = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    for layer in (zero[0], zero[2]):
        nn.init.zeros_(layer.weight), nn.init.zeros_(layer.bias)
    flag = _flag(train_check(zero, x), "dead-relu")
    assert flag.where == "1" and "its input is exactly 0 everywhere, not negative" in flag.message
    assert flag.hint.startswith("initialise weights randomly")
    negative = _mlp()
    with torch.no_grad():
        negative[0].bias.fill_(-100.0)
    flag = _flag(train_check(negative, x), "dead-relu")
    assert "its input is ≤ 0 everywhere" in flag.message
    assert flag.hint == "a large negative bias (or a step that was too large) killed it"


def test_huge_weight_decay_is_named_and_a_usual_one_is_not(x):
    report = train_check(_mlp(), x, optimizer=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=50))
    flag = _flag(report, "weight-decay")
    assert not report.ok and flag.where == "optimizer" and flag.data["pull"] == pytest.approx(0.5)
    assert "lr·weight_decay = 0.5" in flag.message
    usual = train_check(_mlp(), x, optimizer=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2))  # wd 0.01
    assert usual.ok and usual.flags == []


def test_optimizer_built_before_a_layer_was_replaced(x):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters())
    model[2] = nn.Linear(32, 4)
    with pytest.raises(UsageError, match=r"holds 2 tensor\(s\) that are not parameters of this model, and none of "
                                         r"the model's 2.weight, 2.bias: a layer replaced"):
        train_check(model, x, optimizer=opt)


# -- healthy models: no new finding fires -------------------------------------------------------------

def test_healthy_models_pass_without_findings():
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                        nn.Flatten(), nn.Linear(8, 5))
    report = train_check(cnn, torch.randn(8, 3, 8, 8), loss="cross_entropy")
    assert report.ok and report.flags == [], [(f.code, f.message) for f in report.flags]
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
    report = train_check(layer, torch.randn(4, 6, 16))
    assert report.ok and report.flags == [], [(f.code, f.message) for f in report.flags]


def test_tiny_bert_with_a_frozen_embedding_warns_there_only():
    transformers = pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=3)
    model = transformers.BertForSequenceClassification(config)
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    report = train_check(model, input_ids=torch.randint(0, 64, (4, 8)), labels=torch.tensor([0, 1, 2, 1]), steps=20)
    assert report.ok
    assert [(f.code, f.where) for f in report.flags] == [("requires-grad-false", "bert.embeddings.word_embeddings")]

"""What train-check chooses when the user does not say (the output, the loss, its target, how slow is
too slow): every choice checked on real torch / Hugging Face models, and none may turn a healthy
model into a failed check (found in review: each test below failed before its fix)."""

import pytest
import torch
from torch import nn

import layerlab
from layerlab.train.loss import target_seed
from layerlab.train.run import train_check


@pytest.fixture
def x():
    return torch.randn(16, 8, generator=torch.Generator().manual_seed(1))


def _mlp(seed: int = 0, classes: int = 4) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, classes))


# -- a model that computes its own loss -----------------------------------------------------------

class _LossInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = _mlp()

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.net(x), y)


def test_forward_returning_its_loss_is_trained_on_it_not_regressed_to_a_random_number(x):
    y = torch.randint(0, 4, (16,), generator=torch.Generator().manual_seed(2))
    model = _LossInForward()
    report = train_check(model, x, y)
    assert (report.loss, report.output) == ("model", "output")
    assert "read as its own loss" in report.target_source
    # the first loss is the model's own cross-entropy, untouched weights
    assert report.losses[0] == pytest.approx(model(x, y).item(), rel=1e-6)
    assert report.ok and report.fit.verdict == "overfits"


def test_hf_tuple_output_with_labels_reads_the_loss_in_front():
    tf = pytest.importorskip("transformers", reason="needs Hugging Face transformers")
    config = tf.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=16, resid_pdrop=0.0,
                           embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(config)
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    report = train_check(model, input_ids=ids, labels=ids, return_dict=False, steps=20)
    assert (report.loss, report.output) == ("model", "output[0]")  # (loss, logits, past_key_values)
    assert report.losses[0] == pytest.approx(model(input_ids=ids, labels=ids, return_dict=False)[0].item(), rel=1e-5)
    assert report.ok and report.losses[-1] < report.losses[0] / 2


# -- the output the loss reads, chosen by layerlab -------------------------------------------------

def _bert(tf):
    config = tf.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=16)
    torch.manual_seed(0)
    return tf.BertModel(config)


def test_bert_pooler_outside_the_default_output_is_a_warning_not_a_failure():
    tf = pytest.importorskip("transformers", reason="needs Hugging Face transformers")
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    report = train_check(_bert(tf), input_ids=ids, steps=10)
    assert report.output == "output['last_hidden_state']"
    assert report.ok, [(f.code, f.where, f.message) for f in report.errors]
    assert {(f.code, f.where, f.severity) for f in report.flags} == {("unread-output", "pooler", "warning")}
    assert report.flag("unread-output")[0].data["feeds"] == ["output['pooler_output']"]
    assert not report.group("pooler.dense").changed and report.group("encoder.layer.0.output.dense").changed
    # named by the user, the same fact is a failed check
    named = train_check(_bert(tf), input_ids=ids, steps=10, output="last_hidden_state")
    assert {(f.code, f.where, f.severity) for f in named.flags} == {("wrong-output", "pooler", "error")}


# -- the target a torch loss object needs ----------------------------------------------------------

def test_cross_entropy_module_gets_class_index_targets(x):
    model, loss = _mlp(), nn.CrossEntropyLoss(label_smoothing=0.1)
    report = train_check(model, x, loss=loss)
    assert report.target_source.startswith("random class indices")
    target = torch.randint(0, 4, (16,), generator=torch.Generator().manual_seed(target_seed(0)))
    assert report.losses[0] == pytest.approx(loss(model(x), target).item(), rel=1e-6)
    assert min(report.losses) > 0  # a float target of randn made this loss negative and unbounded
    assert report.ok and report.fit.verdict in ("overfits", "falls")


def test_bce_with_logits_gets_zero_one_labels(x):
    model, loss = _mlp(), nn.BCEWithLogitsLoss()
    report = train_check(model, x, loss=loss)
    assert report.target_source.startswith("random 0/1 labels")
    gen = torch.Generator().manual_seed(target_seed(0))
    target = torch.randint(0, 2, (16, 4), generator=gen).float()
    assert report.losses[0] == pytest.approx(loss(model(x), target).item(), rel=1e-6)
    assert report.ok and report.fit.verdict == "overfits"


# -- slow is not flat ------------------------------------------------------------------------------

def _small_init() -> nn.Sequential:
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 4))
    torch.manual_seed(0)  # with the batch below: a 7.7 % fall in 50 steps (seeds nearby: 7–12 %)
    for p in model.parameters():
        nn.init.normal_(p, std=0.02)  # the Hugging Face initializer_range
    return model


def test_plain_sgd_on_small_init_is_slow_a_warning_not_not_learning():
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(3))
    report = train_check(_small_init(), x, optimizer="sgd")  # the default lr 0.1
    assert report.fit.verdict == "slow" and report.ok
    assert [(f.code, f.severity) for f in report.flags] == [("loss-slow", "warning")]
    falls = sum(b < a for a, b in zip(report.losses, report.losses[1:]))
    assert falls == len(report.losses) - 1 and report.losses[-1] < 0.95 * report.losses[0]
    # given the steps, the same model does fall well: it was slow, not stuck
    longer = train_check(_small_init(), x, optimizer="sgd", steps=200)
    assert longer.losses[-1] < longer.losses[0] / 2


def test_a_learning_rate_far_too_small_is_still_flat_and_not_learning(x):
    report = train_check(_mlp(), x, lr=1e-6)
    assert not report.ok and report.fit.verdict in ("flat", "slow")
    assert "not-learning" in {f.code for f in report.errors}
    assert report.group("0").median_ratio < 1e-5  # Adam moves each weight by ≈ lr: 1e-6 of weights ≈ 0.1


# -- a large first step on weights initialised small -----------------------------------------------

def test_adam_on_tiny_init_that_overfits_is_a_large_first_step_warning():
    tf = pytest.importorskip("transformers", reason="needs Hugging Face transformers")
    config = tf.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=16, initializer_range=0.002)
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    report = train_check(tf.GPT2LMHeadModel(config), input_ids=ids, labels=ids)
    assert report.fit.verdict == "overfits" and report.ok, [(f.code, f.where) for f in report.errors]
    assert [f.code for f in report.flags] == ["large-first-step"]
    wte = report.group("transformer.wte")
    # Adam's first step is lr per element: 1e-2 against weights of std 0.002, ≈ 5× their norm
    assert 3 < wte.update_ratio[0] < 8 and wte.median_ratio < 0.3


def test_adam_lr_far_too_high_is_still_unstable(x):
    report = train_check(_mlp(), x, lr=1.0)
    assert report.fit.verdict != "overfits"
    assert "unstable" in {f.code for f in report.errors}


def test_stock_lstm_with_plain_sgd_default_is_slow_not_flat():
    torch.manual_seed(0)
    lstm = nn.LSTM(32, 64, num_layers=2, batch_first=True)
    x = torch.randn(4, 20, 32, generator=torch.Generator().manual_seed(0))
    report = train_check(lstm, x, optimizer="sgd")
    assert report.ok, [(f.code, f.message) for f in report.errors]
    assert report.fit.verdict == "slow" and [f.code for f in report.flags] == ["loss-slow"]
    assert all(b < a for a, b in zip(report.losses, report.losses[1:]))  # every step lowers it
    assert "default lr 0.1" in report.flags[0].hint


def test_dropout_is_named_when_the_loss_falls_short(x):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 4))
    report = layerlab.train_check(model, x, steps=20)
    assert report.fit.verdict in ("falls", "slow")
    assert "dropout is active" in report.fit.message


def test_short_run_on_hf_init_blames_the_default_lr_not_the_model():
    # Adam's first steps move each weight by ≈ lr: 1e-2 on BERT's std-0.02 init is a ratio ≈ 0.5
    tf = pytest.importorskip("transformers", reason="needs Hugging Face transformers")
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 1])
    config = tf.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=16)
    torch.manual_seed(0)
    model = tf.BertForSequenceClassification(config)
    report = train_check(model, input_ids=ids, labels=labels, steps=3)
    assert report.losses[-1] < report.losses[0] and report.ok
    (flag,) = report.flags
    assert (flag.code, flag.severity) == ("large-steps", "warning") and "default lr 0.01" in flag.message
    dense = report.group("bert.encoder.layer.0.output.dense")
    assert 0.3 < dense.update_ratio[0] < 0.8 and dense.status == "large-steps"
    # the same lr, given by the user, is the user's choice: it fails the check
    given = train_check(model, input_ids=ids, labels=labels, steps=3, lr=1e-2)
    assert not given.ok and [f.code for f in given.errors] == ["unstable"]


def test_threads_change_the_cost_not_the_verdict(x):
    before = torch.get_num_threads()
    one = train_check(_mlp(), x, threads=1, steps=10)
    assert torch.get_num_threads() == before  # restored
    default = train_check(_mlp(), x, steps=10)
    assert one.losses == pytest.approx(default.losses, rel=1e-5)
    assert one.fit.verdict == default.fit.verdict and one.ok and default.ok

"""A new user's review of inspect / train-check / precision-check on models written for it.

Each test plants what a forum post shows (or builds a healthy stock model), checks the truth with
plain torch first, then checks layerlab's verdict.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import layerlab
from layerlab.errors import SpecError
from layerlab.train.constant_output import rows_equal


class LogOfSoftmax(nn.Module):
    """``log(softmax(z))`` of large logits: a probability underflows to 0 in float32 already."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        return torch.log(torch.softmax(self.fc(x) * 50, dim=-1))


def test_precision_check_warns_when_float32_itself_is_not_finite():
    torch.manual_seed(0)
    model, x = LogOfSoftmax(), torch.randn(8, 32)
    out = model(x)
    (out * torch.rand_like(out)).sum().backward()
    assert torch.isinf(out).any() and torch.isnan(model.fc.weight.grad).any()  # broken in float32 itself
    model.zero_grad()

    report = layerlab.precision_check(model, x)
    found = [f for f in report.runs[0].findings if f.kind == "float32-non-finite"]
    assert len(found) == 1, report.runs[0].findings
    assert found[0].severity == "warning" and found[0].where == "(root)"
    assert "fc.weight" in found[0].message and "cannot vouch" in found[0].message
    # the printed verdict does not say "ok" about a comparison with a broken reference
    from rich.console import Console

    from layerlab.cli.render_precision import report as render

    console = Console(width=200, record=True, no_color=True)
    for part in render(report):
        console.print(part)
    text = console.export_text()
    assert "? not judged autocast bfloat16 vs float32: float32 itself is not finite" in text
    assert "\nok " not in text


class CausalMaskMaker(nn.Module):
    """Returns a float causal mask: ``-inf`` above the diagonal on purpose."""

    def forward(self, x):
        return nn.Transformer.generate_square_subsequent_mask(x.shape[1])


class CausalAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mask = CausalMaskMaker()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, attn_mask=self.mask(x), need_weights=False)[0]


def test_a_module_returning_an_inf_mask_is_not_a_broken_float32_run():
    torch.manual_seed(0)
    model, x = CausalAttention(), torch.randn(2, 6, 16)
    assert torch.isinf(model.mask(x)).any() and torch.isfinite(model(x)).all()  # -inf on purpose, finite output
    report = layerlab.precision_check(model, x)
    assert report.ok
    assert not [f for f in report.findings if f.kind == "float32-non-finite"]


def _sigmoid_stack(layers: int = 8, width: int = 16) -> nn.Sequential:
    mods = []
    for i in range(layers):
        mods += [nn.Linear(width if i else 10, width), nn.Sigmoid()]
    return nn.Sequential(*mods, nn.Linear(width, 3))


def test_vanishing_sigmoid_stack_is_one_finding_not_an_ignored_input():
    # 10 Linear+Sigmoid layers squash the samples' differences (each sigmoid passes at most 1/4) until
    # the prediction rows agree to 1e-6 (seeds 0-9 all do): the model reads its input, the stack hides it.
    torch.manual_seed(0)
    model, x, target = _sigmoid_stack(10), torch.randn(32, 10), torch.randint(0, 3, (32,))
    assert len(torch.unique(x, dim=0)) == 32  # the samples differ
    assert rows_equal(model(x))              # yet the predictions agree within constant-output's 1e-6
    report = layerlab.train_check(model, x, target=target, loss="cross_entropy", optimizer="sgd", lr=0.1, steps=30)
    codes = [f.code for f in report.flags]
    assert not report.ok and "constant-output" not in codes, codes
    slow = next(f for f in report.flags if f.code == "not-learning")
    assert "vanishes" in slow.message and "squashes the differences between samples" in slow.message
    assert "ReLU" in slow.hint


def test_cross_entropy_with_classes_last_says_to_move_them():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(30, 16), nn.Linear(16, 5))
    ids, labels = torch.randint(0, 30, (4, 7)), torch.randint(0, 5, (4, 7))
    logits = model(ids)
    with pytest.raises(RuntimeError, match="Expected target size"):
        F.cross_entropy(logits, labels)
    F.cross_entropy(logits.movedim(-1, 1), labels)  # the hinted fix is what torch accepts
    with pytest.raises(SpecError) as info:
        layerlab.train_check(model, ids, target=labels, loss="cross_entropy", steps=2)
    assert "movedim(-1, 1)" in info.value.hint and "[4, 7, 5]" in info.value.hint


def test_class_index_past_the_last_class_names_the_class_count():
    torch.manual_seed(0)
    model, x, labels = nn.Linear(10, 3), torch.randn(16, 10), torch.randint(0, 5, (16,))
    assert int(labels.max()) >= 3
    with pytest.raises(IndexError):
        F.cross_entropy(model(x), labels)
    with pytest.raises(SpecError) as info:
        layerlab.train_check(model, x, target=labels, loss="cross_entropy", steps=2)
    assert "[0, 3)" in info.value.hint and f"holds {int(labels.max())}" in info.value.hint


class LastStepWithoutBatchFirst(nn.Module):
    """Reads (N, T, D) with an LSTM built for (T, N, D): ``out[-1]`` has T rows, not N."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(16, 32)
        self.fc = nn.Linear(32, 4)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.fc(out[-1])


def test_batch_size_mismatch_points_at_batch_first():
    torch.manual_seed(0)
    model, x, labels = LastStepWithoutBatchFirst(), torch.randn(8, 12, 16), torch.randint(0, 4, (8,))
    assert model(x).shape[0] == 12  # the time axis came out where the batch should be
    with pytest.raises(SpecError) as info:
        layerlab.train_check(model, x, target=labels, loss="cross_entropy", steps=2)
    assert "dim 0 is 12" in info.value.hint and "batch_first=True" in info.value.hint


class Float16Tagger(nn.Module):
    """An embedding tagger cast to float16: ids pick 4 of 50 rows, the other rows get a 0 gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 8)
        self.out = nn.Linear(8, 5)

    def forward(self, ids):
        return self.out(self.emb(ids))


def test_adam_eps_lost_in_float16_is_named_not_the_learning_rate():
    torch.manual_seed(0)
    ids = torch.tensor([[1, 2, 3, 4], [4, 3, 2, 1]])
    model = Float16Tagger().half()
    # plain torch: Adam's eps=1e-8 is 0 in float16, so an unpicked row's update is 0 / 0, at a tiny lr too
    assert float(torch.tensor(1e-8, dtype=torch.float16)) == 0.0
    twin = Float16Tagger().half()
    twin.load_state_dict(model.state_dict())
    opt = torch.optim.Adam(twin.parameters(), lr=1e-6)
    twin(ids).float().pow(2).mean().backward()
    opt.step()
    assert torch.isnan(twin.emb.weight[10]).all()  # an unpicked row: 0 / 0

    report = layerlab.train_check(model, ids, steps=5)
    nonfinite = next(f for f in report.flags if f.code == "nonfinite")
    assert nonfinite.where == "emb" and "eps=1e-08 is 0 in float16" in nonfinite.message
    assert "lower the learning rate" not in nonfinite.hint and "eps=1e-4" in nonfinite.hint
    # the hinted eps is enough: the same run has no non-finite step
    fixed = layerlab.train_check(model, ids, steps=5,
                                 optimizer=lambda m: torch.optim.Adam(m.parameters(), lr=1e-2, eps=1e-4))
    assert fixed.nonfinite is None


def test_a_float32_learning_rate_overflow_still_says_overflowed():
    torch.manual_seed(0)
    model, x = nn.Linear(4, 2), torch.full((8, 4), 1e30)
    report = layerlab.train_check(model, x, target=torch.full((8, 2), -1e30), optimizer="sgd", lr=1e30, steps=3)
    assert report.nonfinite is not None
    assert "eps" not in report.nonfinite.message


def test_gradient_warning_after_underflow_blames_the_underflow_not_a_forward_finding():
    transformers = pytest.importorskip("transformers", reason="a stock Hugging Face model from a tiny config")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=32, num_labels=3)
    model = transformers.BertForSequenceClassification(cfg)
    ids, mask = torch.randint(0, 100, (4, 10)), torch.ones(4, 10, dtype=torch.long)
    mask[1:, 6:] = 0

    def key_grad(scale: float, half: bool) -> torch.Tensor:  # plain torch: float32 vs float16 autocast
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16, enabled=half):
            logits = model(input_ids=ids, attention_mask=mask).logits
        (logits.float() * torch.linspace(-1, 1, logits.numel()).view_as(logits) * scale).sum().backward()
        return model.bert.encoder.layer[0].attention.self.key.weight.grad.clone() / scale

    ref, unscaled, scaled = key_grad(1.0, False), key_grad(1.0, True), key_grad(2.0 ** 16, True)
    assert int(((unscaled == 0) & (ref != 0)).sum()) > 0      # float16 flushed some of them to 0
    assert int(((scaled == 0) & (ref != 0)).sum()) == 0       # a loss scale keeps them

    report = layerlab.precision_check(model, ids, attention_mask=mask, autocast=["float16"])
    kinds = [f.kind for f in report.runs[0].findings if f.severity == "error"]
    assert kinds and set(kinds) == {"underflow"}, report.runs[0].findings
    grad = next(f for f in report.runs[0].findings if f.kind == "gradient")
    assert "underflow above" in grad.cause and "forward finding" not in grad.cause
    assert layerlab.precision_check(model, ids, attention_mask=mask, autocast=["float16"], grad_scaler=True).ok


class MeanPoolWithFloatMask(nn.Module):
    """``.float()`` on a mask inside forward: in a bfloat16-cast model the pooled vector is float32."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, ids, pad):
        keep = (~pad).unsqueeze(-1).float()
        return self.head((self.emb(ids) * keep).sum(1) / keep.sum(1))


def test_a_run_that_raises_names_the_module_it_raised_in():
    torch.manual_seed(0)
    model, ids = MeanPoolWithFloatMask(), torch.randint(0, 20, (2, 5))
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    cast = MeanPoolWithFloatMask().to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="same dtype"):
        cast(ids, pad)  # plain torch: the float32 pooled vector meets head's bfloat16 weight
    report = layerlab.precision_check(model, ids, pad, autocast=[], cast=["bfloat16"])
    first = report.runs[0].first
    assert first.kind == "raised" and first.where == "head" and ", in head:" in first.message


def test_float_class_labels_are_told_to_be_long():
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3)), torch.randn(8, 10)
    labels = torch.randint(0, 3, (8,)).float()  # criterion(out, labels.float()), a forum favourite
    with pytest.raises(RuntimeError, match="Long"):
        F.cross_entropy(model(x), labels)
    F.cross_entropy(model(x), labels.long())  # what the hint says works
    with pytest.raises(SpecError) as info:
        layerlab.train_check(model, x, target=labels, loss="cross_entropy", steps=2)
    assert "target.long()" in info.value.hint and "float32 of shape [8]" in info.value.hint


class DecoderMissingOutputPadding(nn.Module):
    """A conv autoencoder whose first ConvTranspose2d lacks output_padding=1: 16×16 comes back 14×14."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, 8, 3, 2, 1), nn.ReLU(), nn.Conv2d(8, 16, 3, 2, 1), nn.ReLU())
        self.dec = nn.Sequential(nn.ConvTranspose2d(16, 8, 3, 2, 1), nn.ReLU(),
                                 nn.ConvTranspose2d(8, 1, 3, 2, 1, output_padding=1), nn.Sigmoid())

    def forward(self, x):
        return self.dec(self.enc(x))


def test_reconstruction_target_of_another_shape_points_at_the_model_too():
    torch.manual_seed(0)
    model, x = DecoderMissingOutputPadding(), torch.rand(2, 1, 16, 16)
    assert model(x).shape == (2, 1, 14, 14)  # 2·(4 − 1) − 2 + 3 = 7, then 14: not the input's 16
    with pytest.raises(SpecError) as info:
        layerlab.train_check(model, x, target=x, loss="mse", steps=2)
    assert info.value.got == [2, 1, 16, 16] and info.value.expected == [2, 1, 14, 14]
    assert "the output's shape is what is off" in info.value.hint

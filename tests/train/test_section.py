"""A spec's train: section: values are used, and every bad one is a SpecError at its file:line:col."""

import textwrap

import pytest
import torch

from layerlab.errors import SpecError, UsageError
from layerlab.train.run import train_check

BASE = """\
layer: Linear
args: {in_features: 6, out_features: 3}
input: {shape: [5, 6]}
"""


def _spec(tmp_path, train: str) -> str:
    path = tmp_path / "m.yaml"
    path.write_text(BASE + "train:\n" + textwrap.indent(textwrap.dedent(train), "  "))
    return str(path)


def test_section_values_are_used(tmp_path):
    spec = _spec(tmp_path, """\
        loss: cross_entropy
        target: {value: [0, 2, 1, 1, 0]}
        steps: 7
        optimizer: sgd
        lr: 0.2
    """)
    report = train_check(spec)
    assert (report.loss, report.steps, report.steps_run, report.lr) == ("cross_entropy", 7, 7, 0.2)
    assert report.optimizer.startswith("sgd")
    # the first loss is torch's cross-entropy of the spec's Linear on the spec's literal target
    from layerlab.target.build import from_spec

    t = from_spec(spec)
    x = t.values()[0].detach()
    expected = torch.nn.functional.cross_entropy(t.module(x), torch.tensor([0, 2, 1, 1, 0]))
    assert report.losses[0] == pytest.approx(expected.item(), rel=1e-6)


def test_explicit_arguments_win_over_the_section(tmp_path):
    spec = _spec(tmp_path, "steps: 7\n")
    assert train_check(spec, steps=3).steps_run == 3


def test_target_same_as_an_input_is_an_autoencoder_target(tmp_path):
    path = tmp_path / "ae.yaml"
    path.write_text("layer: Linear\nargs: {in_features: 6, out_features: 6}\ninput: {shape: [5, 6]}\n"
                    "train:\n  target: {same_as: input}\n")
    report = train_check(str(path))
    from layerlab.target.build import from_spec

    t = from_spec(str(path))
    x = t.values()[0].detach()
    assert report.losses[0] == pytest.approx(torch.nn.functional.mse_loss(t.module(x), x).item(), rel=1e-6)
    assert report.ok and report.fit.verdict in ("overfits", "falls")


@pytest.mark.parametrize("train, line, message", [
    ("losss: mse\n", 5, "no key 'losss'"),
    ("loss: hinge\n", 5, "unknown loss 'hinge'"),
    ("loss: ./mine.py:my_loss\n", 5, "import path"),
    ("steps: 1\n", 5, "steps"),
    ("lr: -1\n", 5, "learning rate"),
    ("optimizer: adamm\n", 5, "unknown optimizer"),
    ("steps: 3\ntarget: {shape: [5, 4]}\n", 6, "not the prediction's"),
    ("steps: 3\noutput: logits\n", 6, "no 'logits'"),
    ("target: {shape: [5, 3], init: bogus}\n", 5, "unknown init"),
])
def test_bad_values_point_at_their_line(tmp_path, train, line, message):
    spec = _spec(tmp_path, train)
    with pytest.raises(SpecError, match=message) as info:
        train_check(spec)
    assert info.value.where.startswith(f"{spec}:{line}:"), info.value.where


def test_import_loss_with_allow_import(tmp_path):
    (tmp_path / "mine.py").write_text("import torch\n\ndef l1(pred, target):\n    return (pred - target).abs().mean()\n")
    spec = _spec(tmp_path, "loss: ./mine.py:l1\nsteps: 5\n")
    report = train_check(spec, allow_import=True)
    assert report.loss == "l1" and report.steps_run == 5


def test_python_api_bad_input_is_a_usage_error():
    with pytest.raises(UsageError, match="steps"):
        train_check(torch.nn.Linear(3, 2), torch.randn(4, 3), steps=1)
    with pytest.raises(UsageError, match="unknown loss"):
        train_check(torch.nn.Linear(3, 2), torch.randn(4, 3), loss="hinge")
    with pytest.raises(UsageError, match="nothing to train"):
        train_check(torch.nn.ReLU(), torch.randn(4, 3))


@pytest.mark.parametrize("written", ["torch.nn.functional:cross_entropy", "torch.nn.functional.cross_entropy",
                                     "torch.nn:CrossEntropyLoss"])
def test_torch_losses_by_import_path_need_no_allow_import(tmp_path, written):
    spec = _spec(tmp_path, f"loss: {written}\nsteps: 3\n")
    report = train_check(spec)
    assert report.target_source.startswith("random class indices")
    from layerlab.target.build import from_spec

    t = from_spec(spec)
    target = torch.randint(0, 3, (5,), generator=torch.Generator().manual_seed(
        __import__("layerlab.train.loss", fromlist=["x"]).target_seed(t.seed)))
    expected = torch.nn.functional.cross_entropy(t.module(t.values()[0].detach()), target)
    assert report.losses[0] == pytest.approx(expected.item(), rel=1e-6)

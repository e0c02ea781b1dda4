"""A forward that writes into its input: every repeat of profile and train-check sees the values the
user passed, the user's tensor comes back unchanged, and the report says so (FreshInputs)."""

import torch
from torch import nn

import layerlab


class Scales(nn.Module):
    """Records the input it was given, then writes into it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.seen = []

    def forward(self, x):
        self.seen.append(float(x.abs().sum()))
        x.mul_(3.0)
        return self.lin(x)


SEEN_BY_COPIES = []  # a module global: train-check's copy of the model appends here too


class ScalesCopied(Scales):
    def forward(self, x):
        SEEN_BY_COPIES.append(float(x.abs().sum()))
        return super().forward(x)


def _x():
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(1))


def test_profile_runs_every_step_on_the_values_passed():
    model, x = Scales(), _x()
    given = x.clone()
    report = layerlab.profile(model, x, repeats=3, warmup=1)
    assert len(model.seen) >= 8 and max(model.seen) == min(model.seen) == float(given.abs().sum())
    assert torch.equal(x, given)
    assert any("writes into its input(s) x in place" in n for n in report.notes)


def test_train_check_steps_all_read_the_same_batch():
    model, x = ScalesCopied(), _x()
    given = x.clone()
    SEEN_BY_COPIES.clear()
    report = layerlab.train_check(model, x, steps=5)
    assert torch.equal(x, given)
    assert len(SEEN_BY_COPIES) >= 5 and set(SEEN_BY_COPIES) == {float(given.abs().sum())}
    assert any("writes into its input(s) x in place" in n for n in report.notes)


def test_no_note_for_a_forward_that_leaves_its_input_alone():
    model, x = nn.Linear(4, 2), _x()
    assert not any("writes into its input" in n for n in layerlab.profile(model, x, repeats=2, warmup=0).notes)
    assert not any("writes into its input" in n for n in layerlab.train_check(model, x, steps=3).notes)

"""train-check on gradients far below float32's squared range: a gradient of 1e-31 in every element is
tiny, not "exactly 0" (a float32 sum of squares underflowed to 0 before), and a parameter held by the
model itself that forward does not use is named, not the model."""

import math

import pytest
import torch
import torch.nn as nn

import layerlab


def _scaled(scale):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16))
    with torch.no_grad():
        model[1].weight.mul_(scale)
    return model, torch.randn(4, 16)


@pytest.mark.parametrize("scale", [1e-24, 1e-30])
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_a_tiny_gradient_is_tiny_not_zero(one_thread, scale, optimizer):
    model, x = _scaled(scale)
    out = model(x)
    torch.autograd.backward(out, torch.ones_like(out))
    truth = float(model[0].weight.grad.double().norm())
    assert bool((model[0].weight.grad != 0).all()) and 0 < truth < 1e-20
    model.zero_grad()
    report = layerlab.train_check(model, x, steps=4, optimizer=optimizer)
    codes = {f.code for f in report.flags}
    assert not codes & {"zero-grad", "zero-grad-root", "no-grad"}, report.flags
    first = report.group("0").grad_norm[0]
    assert first is not None and 0 < first < 1e-20 and math.isfinite(first)
    assert report.grad_norms[0] > 0


class Masked(nn.Module):
    """A model holding a parameter itself (a mask embedding) that forward uses only when asked."""

    def __init__(self):
        super().__init__()
        self.mask_embed = nn.Parameter(torch.randn(8))
        self.body = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))

    def forward(self, x, mask=None):
        if mask is not None:
            x = torch.where(mask.unsqueeze(-1), self.mask_embed, x)
        return self.body(x)


def test_an_unused_parameter_of_the_model_itself_is_named(one_thread):
    torch.manual_seed(0)
    report = layerlab.train_check(Masked(), torch.randn(6, 8), steps=5)
    (found,) = [f for f in report.flags if f.code == "no-grad"]
    assert found.where == "mask_embed" and found.data["params"] == ["mask_embed"]
    assert found.message.startswith("mask_embed (a parameter of (root) (Masked))")
    assert found.severity == "warning"
    assert not [f for f in report.flags if f.where == "(root)"]
    # torch agrees: no gradient reaches it, and the body's parameters all get one
    model = Masked()
    model(torch.randn(6, 8)).sum().backward()
    assert model.mask_embed.grad is None and all(p.grad is not None for p in model.body.parameters())


def test_an_unused_leaf_module_is_still_named_by_its_module(one_thread):
    """Near miss: a whole unused submodule keeps the module-level finding (it never ran)."""

    class Spare(Masked):
        def __init__(self):
            super().__init__()
            self.spare = nn.Linear(8, 8)

    torch.manual_seed(0)
    model = Spare()
    report = layerlab.train_check(model, torch.randn(6, 8), steps=5)
    spare = [f for f in report.flags if f.where == "spare"]
    assert spare and spare[0].code == "no-grad" and "never called" in spare[0].message

"""precision-check looks at a tensor once when a later module hands back the same memory (a view,
Flatten, a gradient that is a view of another): it must not take a changed tensor for the one seen.

Each model writes through an alias the version counter does not follow (``.data``); the max |x|
and finiteness of every module output are checked against plain torch forward hooks.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerlab
import layerlab.mixed.capture as capture


class _ScaleThroughData(nn.Module):
    """Scales its input in place without autograd seeing it, and hands back ``.data`` or a view."""

    def __init__(self, give_back: str) -> None:
        super().__init__()
        self.give_back = give_back

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.give_back == "data":  # h's counter moves, h.data (a fresh counter) is still at 0
            with torch.no_grad():
                h.mul_(1000.0)
            return h.data
        h.data.mul_(1000.0)  # no counter moves at all
        return h.view(-1)


class _Model(nn.Module):
    def __init__(self, give_back: str, width: int) -> None:
        super().__init__()
        self.a = nn.Linear(8, width)
        self.b = _ScaleThroughData(give_back)
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return self.head(self.b(h).view(x.shape[0], -1)) + h.sum()


def _torch_amax(model: nn.Module, x: torch.Tensor) -> dict:
    """max |output| of every module call in a plain float32 forward, by path."""
    seen = {}
    handles = [m.register_forward_hook(lambda m, a, o, p=p: seen.__setitem__(p, o.detach().abs().max().item()))
               for p, m in model.named_modules()]
    try:
        model(x.clone())
    finally:
        for h in handles:
            h.remove()
    return seen


@pytest.mark.parametrize("give_back", ["data", "view"])
@pytest.mark.parametrize("width", [8, 2048])  # every element kept, and 8×2048 > MAX_SAMPLES: sampled
def test_a_tensor_changed_behind_its_version_counter_is_looked_at_again(give_back, width):
    torch.manual_seed(0)
    model, x = _Model(give_back, width), torch.randn(8, 8)
    torch.manual_seed(0)
    expected = _torch_amax(_Model(give_back, width), x)  # the same weights, run by plain torch
    assert expected["b"] > 100 * expected["a"]  # the write is real
    run = layerlab.precision_check(model, x).run("autocast bfloat16")
    # the float32 run's max |x| (what the float16 overflow forecast reads) is the changed tensor's
    assert run.row("b").amax == pytest.approx(expected["b"], rel=1e-6)
    assert run.row("a").amax == pytest.approx(expected["a"], rel=1e-6)
    assert run.row("b").finite

def test_flatten_output_and_gradient_are_still_looked_at_once(monkeypatch):
    """The reuse the change was for still happens: a Flatten of a conv output (and the gradient
    reaching it, a view of the Linear's input gradient) costs no second max |x| pass."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Unflatten(1, (8, 64)),
                          nn.Flatten(), nn.Linear(8 * 64, 4))
    x = torch.randn(4, 3, 8, 8)
    measured = []
    real = capture.abs_max
    monkeypatch.setattr(capture, "abs_max", lambda t: measured.append(t.numel()) or real(t))
    report = layerlab.precision_check(model, x)
    # conv, relu (a new tensor) and linear: the Flatten/Unflatten views and the root reuse them
    assert len(measured) == 3
    row = report.run("autocast bfloat16").row("4")
    with torch.no_grad():
        assert row.amax == pytest.approx(model[:5](x).abs().max().item(), rel=1e-6)

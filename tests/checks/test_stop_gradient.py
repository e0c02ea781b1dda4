"""A stop-gradient by design (a target network, an EMA teacher) is no gradcheck verdict; a custom
autograd.Function that drops a used input's gradient still is.

The truth comes from plain torch: autograd gives the cut input no gradient at all (None) while a
finite difference of the output moves.
"""

import torch
import torch.nn.functional as F
from torch import nn

import layerlab
from layerlab.checks.report import Status


class TargetNetworkTDLoss(nn.Module):
    """A DQN temporal-difference loss: the target network's values are detached on purpose."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(6, 4)
        self.target = nn.Linear(6, 4).requires_grad_(False)

    def forward(self, obs, rewards, next_obs):
        q_sa = self.q(obs).max(dim=1).values
        td = rewards + 0.9 * self.target(next_obs).detach().max(dim=1).values
        return F.smooth_l1_loss(q_sa, td)


class _DropsSecond(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        return a * b

    @staticmethod
    def backward(ctx, g):
        return g, None  # BUG: b is used by the forward


class CustomFunctionDropsAnInput(nn.Module):
    def forward(self, a, b):
        return _DropsSecond.apply(a, b)


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 6, generator=g), torch.randn(4, generator=g), torch.randn(4, 6, generator=g)


def test_plain_torch_truth_the_target_input_is_cut_but_moves_the_loss():
    model = TargetNetworkTDLoss()
    obs, rewards, next_obs = _inputs()
    next_obs = next_obs.clone().requires_grad_(True)
    loss = model(obs, rewards, next_obs)
    assert torch.autograd.grad(loss, [next_obs], allow_unused=True) == (None,)
    with torch.no_grad():
        moved = model(obs, rewards, next_obs + 0.1)
    assert float((moved - loss).abs()) > 0


def test_a_target_network_stop_gradient_is_a_warning_not_a_fail():
    torch.manual_seed(0)
    report = layerlab.verify(TargetNetworkTDLoss(), *_inputs())
    check = report.check("gradcheck")
    assert check.status == Status.WARN, check.summary
    assert check.where == "next_obs"
    assert "cannot judge next_obs" in check.summary and "gets no gradient at all" in check.summary
    assert "target network" in check.hint


def test_a_custom_function_that_drops_a_used_input_still_fails():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
    report = layerlab.verify(CustomFunctionDropsAnInput(), a, b)
    check = report.check("gradcheck")
    assert check.status == Status.FAIL, check.summary
    assert "_DropsSecond" in check.summary

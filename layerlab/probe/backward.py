"""The backward pass of ``layerlab.inspect``: the loss, and the gradients it yields.

Default loss (``loss=None``): a seeded random projection of every floating output that requires
grad, ``L = Σᵢ ⟨outᵢ, Rᵢ⟩`` with ``R`` drawn uniformly from ``[−1, 1)`` and scaled so that
``‖(R₁, R₂, …)‖ = 1``. Every output element gets its own non-zero gradient (a sum or mean would give
all of them the same one, and ``.pow(2)`` would give zero gradient to zero outputs), and the
gradient at the output has norm exactly 1, so gradient norms anywhere in the model read as "how
much of a unit signal reaches here". (Uniform rather than normal: CPU draws it about twice as
fast, and any zero-mean direction serves.)

Gradients are taken with ``torch.autograd.grad`` with respect to the trainable parameters and the
inputs that require grad: ``.grad`` of the user's parameters is never touched.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from layerlab.probe.hooks import flatten

RANDOM_PROJECTION = "random projection ⟨out, R⟩, R ~ U(−1, 1) seeded, ‖R‖ = 1"


def differentiable_outputs(output: Any) -> List[torch.Tensor]:
    return [
        t for _, t in flatten(output)
        if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()
    ]


def grad_targets(module: torch.nn.Module, inputs: Sequence[Any]) -> Tuple[List, List]:
    """Trainable parameters ``[(name, p)]`` and the input tensors that are leaves requiring grad."""
    params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    leaves = []
    for value in inputs:
        for _, t in flatten(value):
            if isinstance(t, torch.Tensor) and t.requires_grad and t.is_leaf and not any(t is u for u in leaves):
                leaves.append(t)
    return params, leaves


def run_backward(
    output: Any,
    targets: List[torch.Tensor],
    *,
    loss: Optional[Callable[[Any], torch.Tensor]],
    seed: int,
) -> Tuple[Optional[float], List[Optional[torch.Tensor]], str]:
    """Differentiate the loss w.r.t. ``targets``: ``(loss_value, grads, loss_description)``.

    Raises whatever autograd raises (the caller turns it into a failure).
    """
    if loss is not None:
        value = loss(output)
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise TypeError(f"loss must return a scalar tensor, got {type(value).__name__}")
        grads = torch.autograd.grad(value, targets, allow_unused=True)
        return float(value.detach()), list(grads), getattr(loss, "__name__", "user loss")
    outs = differentiable_outputs(output)
    projections = random_projection(outs, seed)
    value = sum(_dot(o.detach(), r) for o, r in zip(outs, projections))
    grads = torch.autograd.grad(outs, targets, grad_outputs=projections, allow_unused=True)
    return float(value), list(grads), RANDOM_PROJECTION


def random_projection(outs: List[torch.Tensor], seed: int) -> List[torch.Tensor]:
    """One seeded ``U(−1, 1)`` draw for all outputs together, scaled to unit norm, split per output."""
    sizes = [o.numel() for o in outs]
    flat = torch.empty(sum(sizes)).uniform_(-1.0, 1.0, generator=torch.Generator().manual_seed(seed))
    flat /= torch.linalg.vector_norm(flat)
    return [
        part.view(o.shape).to(device=o.device, dtype=o.dtype)
        for part, o in zip(torch.split(flat, sizes), outs)
    ]


def _dot(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.dtype in (torch.float32, torch.float64):
        return float(torch.dot(a.reshape(-1), b.reshape(-1)))
    return float(torch.dot(a.reshape(-1).double(), b.reshape(-1).double()))

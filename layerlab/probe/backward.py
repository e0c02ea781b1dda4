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
META_PROJECTION = "⟨out, R⟩ on meta (shapes only: no values)"


def differentiable_outputs(output: Any) -> List[torch.Tensor]:
    from layerlab.target.bind import refuse_lazy

    refuse_lazy(output, "the model's output")
    return [
        t for _, t in flatten(output)
        if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()
    ]


def grad_targets(
    module: torch.nn.Module, inputs: Sequence[Any], named: Optional[List] = None
) -> Tuple[List, List]:
    """Trainable parameters ``[(name, p)]`` and the input tensors that are leaves requiring grad.

    ``named``: ``list(module.named_parameters())`` when the caller has it already.
    """
    if named is None:
        named = list(module.named_parameters())
    params = [(n, p) for n, p in named if p.requires_grad]
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
    outs: Optional[List[torch.Tensor]] = None,
    trace: Any = None,
) -> Tuple[Optional[float], List[Optional[torch.Tensor]], str]:
    """Differentiate the loss w.r.t. ``targets``: ``(loss_value, grads, loss_description)``.

    ``outs``: ``differentiable_outputs(output)`` when the caller has it already; ``trace``: an op trace
    to record the user's loss under. A loss that raises (or returns no scalar tensor) raises
    :class:`~layerlab.probe.loss_failure.LossRaised`; otherwise this raises whatever autograd raises
    (the caller turns either into a failure, of the loss or of the backward).
    """
    if loss is not None:
        from layerlab.probe.loss_failure import compute_loss

        value = compute_loss(loss, output, trace)
        grads = torch.autograd.grad(value, targets, allow_unused=True)
        read = None if value.is_meta else float(value.detach())
        return read, list(grads), getattr(loss, "__name__", "user loss")
    if outs is None:
        outs = differentiable_outputs(output)
    if any(o.is_meta for o in outs):  # a shape-only run: output gradients of the right shapes, no draw
        grads = torch.autograd.grad(outs, targets, grad_outputs=[torch.empty_like(o) for o in outs],
                                    allow_unused=True)
        return None, list(grads), META_PROJECTION
    projections = random_projection(outs, seed)
    value = sum(_dot(o.detach(), r) for o, r in zip(outs, projections))
    grads = torch.autograd.grad(outs, targets, grad_outputs=projections, allow_unused=True)
    return float(value), list(grads), RANDOM_PROJECTION


def random_projection(outs: List[torch.Tensor], seed: int) -> List[torch.Tensor]:
    """One seeded ``U(−1, 1)`` draw for all outputs together, scaled to unit norm, split per output."""
    sizes = [o.numel() for o in outs]
    return [
        part.view(o.shape).to(device=o.device, dtype=o.dtype)
        for part, o in zip(torch.split(_unit_draw(seed, sum(sizes)), sizes), outs)
    ]


#: The last projection drawn: ``(seed, numel, dtype) -> (tensor, its _version)``. Drawing is the
#: costly part (the generator is serial: about 3 ns a value, 0.3 ms for a 16×50×128 output), and
#: inspecting the same model again draws the same values, so the last one is kept when it has at
#: most _DRAW_CACHE_MAX values. Its views are handed to autograd as read-only output gradients;
#: should anything write into them (a user's gradient hook working in place), the version
#: counter they share with the kept tensor moves, and the next call draws afresh.
_last_draw: dict = {}
_DRAW_CACHE_MAX = 1 << 20


def _unit_draw(seed: int, n: int) -> torch.Tensor:
    """``n`` values from ``U(−1, 1)`` of a generator seeded with ``seed`` (default dtype, CPU),
    scaled to unit L2 norm."""
    key = (seed, n, torch.get_default_dtype())
    kept = _last_draw.get(key)
    if kept is not None and kept[0]._version == kept[1]:
        return kept[0]
    flat = torch.empty(n).uniform_(-1.0, 1.0, generator=torch.Generator().manual_seed(seed))
    flat /= torch.linalg.vector_norm(flat)
    if n <= _DRAW_CACHE_MAX:
        _last_draw.clear()
        _last_draw[key] = (flat, flat._version)
    return flat


def _dot(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.dtype in (torch.float32, torch.float64):
        return float(torch.dot(a.reshape(-1), b.reshape(-1)))
    return float(torch.dot(a.reshape(-1).double(), b.reshape(-1).double()))

"""Do two surviving fixes mean the same thing? Decided by running them, never by their edit kinds.

Two fixes that both make the model run and pass every oracle are one fix only if the two fixed
copies compute the same outputs, on the same weights, from the same inputs and seed (eval mode):
``x.transpose(1, 2)`` dropped upstream and ``x.permute(0, 2, 1)`` before the layer are one edit
written twice; ``bmm(t, x)`` and ``bmm(x.transpose(1, 2), t).transpose(1, 2)`` are two models
(``t`` or ``tᵀ`` applied) and no one of them may be crowned: both are named, with the fact about
the data that decides (:func:`deciding_fact`).

A fix that changes a parameter's shape cannot be compared with one that does not (the weights do
not load): :func:`same_meaning` says ``False`` (two meanings), and the ranking's rule that the
parameters as built are the author's intent (:class:`layerlab.engine.fix_search.Scored`) settles
between them. Everything runs on copies; the user's model is never touched.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch

#: Outputs closer than this (relative, absolute) are the same: the same maths in another op order.
SAME_RTOL, SAME_ATOL = 1e-4, 1e-5


def _fixed(module, steps):
    from layerlab.probe.fixes import apply_fixes

    try:
        return apply_fixes(module, list(steps))
    except Exception:  # noqa: BLE001 - a fix that cannot be applied here cannot be compared
        return None


def _outputs(fixed, args, kwargs, seed) -> Optional[List[torch.Tensor]]:
    from layerlab.probe.hooks import flatten
    from layerlab.target.seeding import seeded

    fixed.eval()
    try:
        with torch.no_grad(), seeded(seed, fixed, [*args, *kwargs.values()]):
            out = fixed(*args, **kwargs)
    except Exception:  # noqa: BLE001 - a copy that does not run in eval mode: not comparable
        return None
    return [v for _, v in flatten(out, "") if isinstance(v, torch.Tensor)]


def _shapes(model: torch.nn.Module) -> dict:
    from torch.nn.parameter import is_lazy  # a lazy module that never ran has no shape yet

    return {k: (None if is_lazy(v) else tuple(v.shape)) for k, v in model.state_dict().items()}


def same_meaning(module, a_steps: Sequence, b_steps: Sequence, args, kwargs, seed) -> bool:
    """True when the two fixed copies compute the same outputs on the same weights and inputs (eval mode)."""
    a, b = _fixed(module, a_steps), _fixed(module, b_steps)
    if a is None or b is None or _shapes(a.model) != _shapes(b.model):
        return False
    try:  # a rebuilt layer of the same shape gets the other copy's weights: the same weights on both
        b.model.load_state_dict(a.model.state_dict(), strict=True)
    except Exception:  # noqa: BLE001
        return False
    xs, ys = _outputs(a, args, kwargs, seed), _outputs(b, args, kwargs, seed)
    if xs is None or ys is None or len(xs) != len(ys):
        return False
    for x, y in zip(xs, ys):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if x.is_floating_point() or x.is_complex():
            if not torch.allclose(x, y, rtol=SAME_RTOL, atol=SAME_ATOL, equal_nan=True):
                return False
        elif not torch.equal(x, y):
            return False
    return True


def reshapes(module, steps: Sequence) -> bool:
    """True when the fixes change a parameter's shape (a ``set-arg`` of ``stride`` rebuilds a layer
    with new weights of the same shapes: that keeps them)."""
    fixed = _fixed(module, steps)
    return fixed is None or _shapes(fixed.model) != _shapes(module)


def deciding_fact(*decides: str) -> str:
    """The fact about the data that tells two readings apart (a candidate's own, else what differs)."""
    for d in decides:
        if d:
            return d
    return ("what the data's axes mean: the two fixed copies compute different outputs on the same "
            "weights and inputs")

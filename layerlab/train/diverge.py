"""The first step where the loss or a gradient is NaN/Inf, and the module it came from.

The training loop stops at that step with the weights as they were when it ran; this module
re-runs that one step through :func:`layerlab.inspect` on a copy (so the copy's hooks see every
module call) with the same loss, and takes inspect's own verdicts: the first module whose *output*
is not finite while its inputs were (``nonfinite-forward``), else the first module, in backward
order, whose input gradient is not finite while its output gradient was (``nonfinite-backward``).
When neither names a module, the outputs were finite and the loss itself overflowed: ``(loss)``.

Weights that an update made non-finite (finite gradients times a huge learning rate) need no
re-run: the update of that step did it, and the parameters are named.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from layerlab.errors import LayerlabError
from layerlab.target.copying import copy_model
from layerlab.train.report import NonFinite

__all__ = ["locate", "weights_blew_up"]


def locate(model: Any, positional: list, keyword: Dict[str, Any], objective: Any, step: int, what: str,
           params: List[str], seed: int) -> NonFinite:
    """Re-run ``step`` on a copy of ``model`` under ``layerlab.inspect``; the module to blame."""
    from layerlab.probe.run import inspect

    twin = copy_model(model)
    try:
        report = inspect(twin, *positional, loss=objective, seed=seed, mode=None, fix=False, ops=False,
                         forward_kwargs=keyword)
    except LayerlabError as exc:  # the step raised under inspect: say so rather than guess
        return NonFinite(step, what, "?", f"re-running step {step} under layerlab.inspect raised: {exc.message}",
                         params)
    codes = ("nonfinite-forward",) if what == "loss" else ("nonfinite-forward", "nonfinite-backward")
    for code in codes:
        found = [p for p in report.problems if p.code == code]
        if found:
            return NonFinite(step, what, found[0].where or "(root)", found[0].message, params)
    if what == "loss":
        message = f"every module output is finite at step {step}, but the loss is not: it overflowed"
    else:
        message = (f"the loss is finite at step {step} but gradients are not, and no module's backward is "
                   "seen to produce it (a custom autograd.Function, or an op between modules)")
    return NonFinite(step, what, "(loss)" if what == "loss" else "?", message, params)


def weights_blew_up(step: int, params: List[str], lr: Optional[float], eps: Any = None,
                    tensors: Optional[List[Any]] = None) -> NonFinite:
    """``eps``: the optimizer's (Adam's 1e-8); ``tensors``: the parameters named in ``params``, after
    the update. An eps that rounds to 0 in their dtype (1e-8 in float16) makes the update of every
    element whose gradient is 0 a 0 / 0 = NaN (and of one whose square underflows, g / 0 = inf), whatever
    the learning rate: said so, not "overflowed"."""
    rate = f" (lr {lr:g})" if lr is not None else ""
    owner = params[0].rpartition(".")[0] or "(root)"
    lost = _eps_lost(eps, tensors or [])
    if lost is not None:
        return NonFinite(step, "weights", owner,
                         f"the update of step {step}{rate} made {', '.join(params[:4])} not finite although the "
                         f"gradients were finite: the optimizer's eps={eps:g} is 0 in {lost}, so wherever a gradient "
                         "is 0 (an embedding row no id picks, a unit that is off) or so small that its square "
                         "underflows, the update divides by 0 (0 / 0 = NaN), at any learning rate", params,
                         hint=f"keep the weights in float32 and train under torch.autocast (layerlab precision-check "
                              f"measures it), use bfloat16, or give the optimizer an eps {lost} can hold (eps=1e-4)")
    return NonFinite(step, "weights", owner,
                     f"the update of step {step}{rate} made {', '.join(params[:4])} not finite: the gradients were "
                     "finite, the step times the learning rate overflowed", params)


def _eps_lost(eps: Any, tensors: List[Any]) -> Optional[str]:
    """The dtype of a non-finite parameter in which ``eps`` rounds to 0, if there is one."""
    import torch

    if not isinstance(eps, float) or eps <= 0:
        return None
    for t in tensors:
        lost = t.is_floating_point() and float(torch.tensor(eps, dtype=t.dtype)) == 0.0
        if lost and not bool(torch.isfinite(t).all()):
            return str(t.dtype).replace("torch.", "")
    return None

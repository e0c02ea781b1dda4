"""A large output: a gradcheck mismatch that float64 rounding of the output explains, not the backward.

A central difference subtracts two outputs: ``(f(x + h) − f(x − h)) / 2h``. Each output is rounded
to float64, so the difference carries an error of a few ulps of ``|y|``, divided by ``2h``. For
outputs of ordinary size that is ~1e-9 and invisible; for a layer that adds a large constant (an
offset of 1e8, a "−1e9 instead of −inf" mask left in the output) it is ~1e-2 at ``h = 1e-6`` — a
correct layer then fails ``torch.autograd.gradcheck`` itself (measured: ``Linear(x) + 1e8``,
analytical/numerical 0.91).

What is done: when every failing pair's error is within that rounding band, the pairs are measured
again at a step large enough that the band falls under a tenth of the tolerance (capped at 1e-2).
A wrong backward is off by the same amount at any step, so it stays off (and keeps its verdict if it
is off by more than the band); a correct one agrees, and the report says why a larger step was used.
Where the larger step disagrees but the band could still explain it, the check says it cannot tell.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from layerlab.checks.directional import allowed as tolerance, finite, numerical
from layerlab.checks.report import CheckResult, Status

__all__ = ["rounding_band", "large_output"]

#: ulps of ``|y|`` a forward may lose per element (the last add alone loses ½; a few ops more)
ULPS = 4.0
#: the largest step tried: beyond it, truncation error of a curved layer would dominate
MAX_STEP = 1e-2


def rounding_band(outs, eps: float) -> List[float]:
    """Per output: how far float64 rounding of ``y`` can move ``⟨v, Δy⟩ / 2eps`` (``‖v‖ = 1``)."""
    resolution = torch.finfo(torch.float64).eps
    return [ULPS * resolution * float(y.detach().abs().max()) * (y.numel() ** 0.5) / (2 * eps) for y in outs]


def large_output(run: Any, sure: List[Dict[str, Any]], details: Dict[str, Any], precision: str,
                 what: str) -> Optional[CheckResult]:
    """A verdict for the failing rows ``sure`` when the output's size explains them; ``None`` otherwise.

    ``run`` is :class:`layerlab.checks.numgrad._Run` (an all-float64 run)."""
    if not sure:
        return None
    paths = [d["path"] for d in details["outputs"]]
    band = rounding_band(run.outs, run.eps)
    if not all(r["abs_diff"] <= band[paths.index(r["output"])] for r in sure):
        return None
    atol = run.opts.atol
    step = min(MAX_STEP, run.eps * max(band) / (0.1 * atol))
    which = list(dict.fromkeys(run.names.index(r["tensor"]) for r in sure))
    num = numerical(run.f, run.tensors, run.us, run.vs, step, which, as_with_grad=run.as_with_grad)
    band_big = rounding_band(run.outs, step)
    rows, agree = [], True
    for r in sure:
        i, j = run.names.index(r["tensor"]), paths.index(r["output"])
        nu = num[i][j]
        allowed = tolerance(atol, run.us[i], run.vs[j], details["rtol"], nu) + band_big[j]
        ok = finite(nu) and abs(r["analytical"] - nu) <= allowed
        agree = agree and ok
        rows.append({"tensor": r["tensor"], "output": r["output"], "analytical": r["analytical"], "numerical": nu,
                     "allowed": allowed, "ok": ok})
    scale = max(float(y.detach().abs().max()) for y in run.outs)
    details["large_output"] = {"max_abs_output": scale, "band_at_eps": band, "step": step, "rows": rows}
    listed = ", ".join(dict.fromkeys(r["tensor"] for r in sure))
    if agree:
        return CheckResult("gradcheck", Status.PASS,
                           f"analytical = numerical gradients ({precision}) for {what}; {listed} at a step of "
                           f"{step:.2g}: the output reaches {scale:.3g}, so at {run.eps:g} float64 rounding of the "
                           f"output alone moves the finite difference by up to {max(band):.2g}", details=details)
    worst = max(rows, key=lambda r: abs(r["analytical"] - r["numerical"]))
    # a wrong backward is off by the same amount at any step: the numerical derivative stable
    # between ``step`` and ``step / 4`` (within that step's band) and still off is a verdict
    num4 = numerical(run.f, run.tensors, run.us, run.vs, step / 4, which, as_with_grad=run.as_with_grad)
    band4 = rounding_band(run.outs, step / 4)
    stable = all(finite(r["numerical"]) and abs(num4[run.names.index(r["tensor"])][paths.index(r["output"])]
                 - r["numerical"]) <= r["allowed"] + band4[paths.index(r["output"])] for r in rows if not r["ok"])
    if stable:
        listed = ", ".join(dict.fromkeys(r["tensor"] for r in rows if not r["ok"]))
        ratio = worst["analytical"] / worst["numerical"] if worst["numerical"] else float("nan")
        return CheckResult("gradcheck", Status.FAIL,
                           f"wrong gradient w.r.t. {listed}: d{worst['output']}/d{worst['tensor']} along a random "
                           f"direction: analytical {worst['analytical']:.6g} vs numerical {worst['numerical']:.6g}, "
                           f"ratio analytical/numerical {ratio:.4g}, the same at steps {step:.2g} and {step / 4:.2g} "
                           f"(the output reaches {scale:.3g}: at {run.eps:g} float64 rounding alone would blur it)",
                           where=listed, hint="the backward does not compute the derivative of the forward: check the "
                           "custom autograd.Function's backward (or a .detach()/.data) for " + listed, details=details)
    return CheckResult("gradcheck", Status.WARN,
                       f"cannot tell: the output reaches {scale:.3g}, so float64 rounding moves the finite "
                       f"difference by up to {max(band):.2g} at step {run.eps:g}, as much as the mismatch; at step "
                       f"{step:.2g} d{worst['output']}/d{worst['tensor']} is {worst['numerical']:.6g} vs analytical "
                       f"{worst['analytical']:.6g}", where=listed,
                       hint="check the gradient with the large constant removed from the output (it does not change "
                            "the gradient)", details=details)

"""Inputs that sit exactly on a kink: a gradcheck mismatch that is the point's fault, not the backward's.

A central difference at a point where the layer is not differentiable — ``relu(x)`` at ``x = 0``,
``max`` over tied values — measures the average of the two one-sided slopes (½ for ReLU at 0) at
*every* step, so shrinking the step (:func:`layerlab.checks.numgrad._finer_step`) does not help,
while autograd returns a subgradient by convention (0 for ReLU). ``torch.autograd.gradcheck``
itself fails a stock ``nn.ReLU`` fed exact zeros. Inputs with exact zeros are common (padding,
masks, a spec's ``init: zeros``), so that failure would be a false "wrong gradient".

What is done: the entries that can sit on a kink — exact zeros, and values tied with another
entry of the same tensor — are moved off it by about 1e-3 (seeded, random sign and size), and the
failing directions are measured again there. A backward that computes the wrong derivative is
wrong at the moved point too (a dropped term, a wrong tensor, a missing sum do not depend on the
point); a correct one agrees. Only when every failing pair agrees at the moved point is the
mismatch put down to the kink; the report then says which entries were moved and why.

Legend: u the random input direction · v the random output direction.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch
from torch import Tensor

from layerlab.checks.directional import allowed as tolerance, analytical, finite, numerical

__all__ = ["kink_entries", "off_kinks"]

#: how far (relative to 1 + |x|) an entry on a kink is moved: far beyond any gradcheck step (1e-6)
#: and its finer look (1e-7), small enough to keep the layer in the same regime elsewhere
MOVE = 1e-3
#: tensors larger than this are not searched for ties (torch.unique sorts the whole tensor)
MAX_TIE_SEARCH = 1 << 20


def kink_entries(t: Tensor) -> Tuple[Tensor, int, int]:
    """``(mask, zeros, tied)``: the entries of ``t`` that are exactly 0 or equal to another entry."""
    flat = t.detach().reshape(-1)
    zeros = flat == 0
    tied = torch.zeros_like(zeros)
    if 1 < flat.numel() <= MAX_TIE_SEARCH:
        _, inverse, counts = torch.unique(flat, return_inverse=True, return_counts=True)
        tied = (counts[inverse] > 1) & ~zeros
    return (zeros | tied).view(t.shape), int(zeros.sum()), int(tied.sum())


def off_kinks(run: Any, sure: List[Dict[str, Any]], details: Dict[str, Any], seed: int = 0) -> List[Dict[str, Any]]:
    """The failing rows ``sure`` that agree once every float tensor of ``run`` is moved off its kinks.

    ``run`` is :class:`layerlab.checks.numgrad._Run`. Returns all of ``sure`` or nothing: a partial
    agreement is not explained by the kinks alone. ``details["kinks"]`` keeps the numbers."""
    if not sure:
        return []
    gen = torch.Generator().manual_seed(seed)
    moved: List[Tensor] = []
    found: List[Dict[str, Any]] = []
    for name, t in zip(run.names, run.tensors):
        if not (isinstance(t, Tensor) and t.is_floating_point()):
            moved.append(t)
            continue
        mask, zeros, tied = kink_entries(t)
        if zeros or tied:
            found.append({"tensor": name, "zeros": zeros, "tied": tied, "numel": t.numel()})
            size = 0.5 + 0.5 * torch.rand(t.shape, generator=gen, dtype=t.dtype)
            sign = torch.where(torch.rand(t.shape, generator=gen) < 0.5, -1.0, 1.0).to(t.dtype)
            t = t.detach() + mask * sign * size * MOVE * (1 + t.detach().abs())
        moved.append(t.detach())
    if not found:
        return []
    which = list(dict.fromkeys(run.names.index(r["tensor"]) for r in sure))
    leaves = [t.requires_grad_(True) if t.is_floating_point() else t for t in moved]
    outs = run.f(*leaves)
    a, _, nonfinite = analytical(outs, run.vs, [leaves[i] for i in which], [run.us[i] for i in which])
    num = numerical(run.f, leaves, run.us, run.vs, run.eps, which, as_with_grad=run.as_with_grad)
    paths = [d["path"] for d in details["outputs"]]
    rows = []
    for r in sure:
        i, j = run.names.index(r["tensor"]), paths.index(r["output"])
        an, nu = a[which.index(i)][j], num[i][j]
        allowed = tolerance(run.opts.atol, run.us[i], run.vs[j], details["rtol"], nu)
        rows.append({"tensor": r["tensor"], "output": r["output"], "analytical": an, "numerical": nu,
                     "allowed": allowed, "ok": finite(an) and finite(nu) and abs(an - nu) <= allowed})
    details["kinks"] = {"moved": found, "by": f"{MOVE:g}·(1 + |x|), random sign", "rows": rows}
    if nonfinite or not all(r["ok"] for r in rows):
        return []
    return list(sure)


def describe(details: Dict[str, Any]) -> str:
    """``x: 12 exact zero(s), w: 3 tied value(s)`` for the report."""
    parts = []
    for m in details["kinks"]["moved"]:
        what = [f"{m['zeros']} exact zero(s)"] * bool(m["zeros"]) + [f"{m['tied']} tied value(s)"] * bool(m["tied"])
        parts.append(f"{m['tensor']}: {' and '.join(what)} of {m['numel']}")
    return "; ".join(parts)

"""torch's slow-mode gradcheck on one tensor, to confirm a mismatch the fast directional check found.

The directional check compares one random direction per tensor; a failing tensor is checked again
element by element (``fast_mode=False``), when its Jacobian fits under ``slow_cap`` elements, so a
FAIL always rests on torch's own check where that is affordable.
"""

from __future__ import annotations

from typing import Any, Dict

import torch
from torch import Tensor
from torch.autograd.gradcheck import GradcheckError

__all__ = ["slow_gradcheck"]


def slow_gradcheck(f, tensors, i: int, name: str, n_out: int, o: Any) -> Dict[str, Any]:
    """torch's slow gradcheck on tensor ``i`` alone, if its Jacobian fits under the cap."""
    size = tensors[i].numel() * n_out
    info: Dict[str, Any] = {"tensor": name, "jacobian_elements": size, "cap": o.slow_cap}
    if size > o.slow_cap:
        info.update(ran=False, reason=f"its Jacobian would have {size:,} elements > cap {o.slow_cap:,}")
        return info
    fixed = [t.detach() for t in tensors]

    def fi(x: Tensor):
        args = list(fixed)
        args[i] = x
        return f(*args)

    x = fixed[i].clone().requires_grad_(True)
    try:
        torch.autograd.gradcheck(fi, (x,), eps=o.eps, atol=o.atol, rtol=o.rtol, fast_mode=False,
                                 raise_exception=True)
        info.update(ran=True, passed=True, message="slow mode passes")
    except GradcheckError as exc:
        first = str(exc).strip().splitlines()[0].rstrip(",")
        info.update(ran=True, passed=False, message=f"{first} ({name})", error=str(exc)[:1500])
    return info

"""A lower-rank operand that matches the *leading* dims of the other: it lacks trailing size-1 axes.

Broadcasting aligns shapes from the right, so a diffusion U-Net's time embedding ``t`` (B, C)
added to a feature map ``h`` (B, C, H, W) is read as (…, H, W) and raises. Resizing the layer that
made ``t`` (``out_features=W``) is not the fix — the embedding is per channel. When ``t``'s shape
is exactly ``h``'s first dims, the fix is ``t[:, :, None, None]``; when its last size also equals
``h``'s last (it could be meant per column), the rule says nothing. Nor when one of ``t``'s non-batch
sizes also sits further right in ``h``: a query mask (B, T) on scores (B, H, T, S) with H == T
matches the leading dims by chance, and ``mask[:, :, None, None]`` would run and mask heads.
"""

from __future__ import annotations

import re
from typing import Optional

from layerlab.engine.rule_registry import register_rule
from layerlab.probe import op_triggers as ops
from layerlab.probe.context import op_at, op_site
from layerlab.probe.report import Diagnosis, FixStep


def _broadcasts(a, b) -> bool:
    return all(x == y or 1 in (x, y) for x, y in zip(reversed(a), reversed(b)))


def _operand_name(code: Optional[str], position: int) -> Optional[str]:
    found = re.search(r"([A-Za-z_][\w.]*)\s*[-+*/]=?\s*([A-Za-z_][\w.]*)\s*(?:#.*)?$", code or "")
    return found.group(position + 1) if found else None


@register_rule("broadcast/missing-trailing-axes", stage="op", on=ops.BROADCAST, order=260)
def missing_trailing_axes(ctx) -> Optional[Diagnosis]:
    """A lower-rank operand matching the other's leading dims lacks trailing size-1 axes (``t[:, :, None,
    None]``)."""
    failed = ctx.failed_op
    args = [(i, a) for i, a in enumerate(failed.args[:2]) if hasattr(a, "shape") and a.dim() > 0]
    if len(args) != 2:
        return None
    (ia, a), (ib, b) = args
    for (pos, small), big in (((ib, b), a), ((ia, a), b)):
        k = small.dim()
        if k >= big.dim() or list(small.shape) != list(big.shape[:k]) or _broadcasts(small.shape, big.shape):
            continue
        if small.shape[-1] == big.shape[-1]:
            return None  # it may be meant along the last axis: not for this rule to say
        if any(small.shape[i] in big.shape[i + 1:] for i in range(1, k)):
            return None  # another alignment fits as well: the sizes do not say which axis it is
        extra = list(range(k, big.dim()))
        record = failed.record
        name = _operand_name(record.code, pos) or ("b" if pos else "a")
        index = f"{name}[{', '.join([':'] * k + ['None'] * len(extra))}]"
        origin = ctx.origin(name, small).text
        return Diagnosis(
            f"`{record.op}`{op_at(record)} broadcasts {list(big.shape)} with {name} {list(small.shape)}: "
            f"{name} holds the *leading* dims of the other ({list(small.shape)}), but broadcasting aligns "
            f"shapes from the right, so it meets the trailing ones; {origin}",
            expected=list(big.shape[:k]) + [1] * len(extra), got=list(small.shape), cause="broadcast",
            hint=f"add the missing trailing axes: {index}{op_at(record)} → "
                 f"{list(small.shape) + [1] * len(extra)} (one value per "
                 f"{'channel' if big.dim() >= 3 and k == 2 else 'leading index'}, spread over the rest)",
            fix=FixStep("replace-op", record.source or "", index,
                        op_site(record, arg=pos, to="insert:" + ",".join(map(str, extra)))),
            alternatives=[f"not a new size for the layer that made {name}: it would pair its values with "
                          "the trailing axes instead of the leading ones"],
            rule="broadcasting aligns from the right: (B, C) + (B, C, H, W) needs (B, C, 1, 1)",
        )
    return None

"""The per-dim arithmetic of a pool as the user sees it: the step, the notes, the fixes (§3.1, §14.4).

``dim_step`` writes one :class:`DimStep` (the formula in symbols and with numbers); ``dim_notes``
adds what torch does silently on a valid dim: ceil mode's extra or dropped last window, and real
pixels that no window reads (``cropped`` at the end, ``skipped`` between windows — the same set
as the input positions that get zero gradient). ``too_small_fixes`` proposes settings that give a
non-empty output. The checks and torch's messages live in :mod:`layerlab.shapes.pool`.

Symbols: ``L`` input size, ``k`` kernel, ``s`` stride, ``p`` padding, ``d`` dilation,
``E = d·(k−1) + 1``. Window ``j`` starts at padded position ``j·s``; real pixel ``x`` sits at
padded position ``x + p``.
"""

from __future__ import annotations

import math
from typing import List, Sequence, Tuple

from layerlab.shapes.arith import effective_kernel, pool_out
from layerlab.shapes.unread import unread_notes
from layerlab.shapes.result import DimStep, Explanation, ShapeNote

#: Names of the spatial dims, as used in steps and notes.
DIM_NAMES = {1: ("L",), 2: ("H", "W"), 3: ("D", "H", "W")}

FLOOR_FORMULA = "(L + 2p − E) // s + 1"
CEIL_FORMULA = "(L + 2p − E + s − 1) // s + 1, minus 1 if (out − 1)·s ≥ L + p"


def dim_step(ex: Explanation, name: str, L: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    """Append the arithmetic of one dim; return the size (may be ≤ 0: the caller raises)."""
    E = effective_kernel(k, d)
    values = {"k": k, "s": s, "p": p, "d": d, "E": E, "ceil_mode": ceil}
    if not ceil:
        out = pool_out(L, k, s, p, d, False)[0]
        ex.steps.append(DimStep(name, L, FLOOR_FORMULA, f"({L} + 2·{p} − {E}) // {s} + 1", out, values))
        return out
    out, dropped = pool_out(L, k, s, p, d, True)
    naive = out + 1 if dropped else out
    sub = f"({L} + 2·{p} − {E} + {s} − 1) // {s} + 1 = {naive}"
    if dropped:
        sub += f"; ({naive} − 1)·{s} = {(naive - 1) * s} ≥ {L} + {p} → {out}"
    values.update(naive=naive, dropped=dropped)
    ex.steps.append(DimStep(name, L, CEIL_FORMULA, sub, out, values))
    return out


def _ceil_notes(ex: Explanation, name: str, L: int, k: int, s: int, p: int, d: int) -> None:
    """``ceil-dropped`` / ``ceil-extra-window`` for one valid dim in ceil mode."""
    E = effective_kernel(k, d)
    out, dropped = pool_out(L, k, s, p, d, True)
    naive = out + 1 if dropped else out
    floor_out = (L + 2 * p - E) // s + 1
    if dropped:
        ex.notes.append(ShapeNote(
            "ceil-dropped",
            f"{name}: the ceil_mode formula gives {naive} windows, but window {naive - 1} would start "
            f"at padded position {(naive - 1) * s}, which is in the right padding or past it "
            f"(the real pixels end at {L + p}), so torch drops it: {out} windows"
            + (" — the same as floor mode." if out == floor_out else "."),
            dim=name, data={"naive": naive, "output": out, "start": (naive - 1) * s, "limit": L + p},
        ))
    if out > floor_out:
        start = (out - 1) * s
        past = start + E - (L + 2 * p)
        ex.notes.append(ShapeNote(
            "ceil-extra-window",
            f"{name}: ceil_mode adds a last window (index {out - 1}: {out} windows, floor mode gives "
            f"{floor_out}); it starts at padded position {start} and reads {past} position(s) past the end of "
            "the padded input, which are ignored.",
            dim=name, severity="info", data={"window": out - 1, "start": start, "past_end": past},
        ))


def dim_notes(ex: Explanation, name: str, L: int, k: int, s: int, p: int, d: int, n: int, ceil: bool) -> None:
    """All notes of one valid dim: ceil mode's extra/dropped window, unread pixels."""
    if ceil:
        _ceil_notes(ex, name, L, k, s, p, d)
    ex.notes.extend(unread_notes(name, L, k, s, p, d, n))


def too_small_fixes(dims: Sequence[Tuple[int, int, int, int, int, int]], ceil: bool, can_pad: bool) -> List[str]:
    """Settings that give ≥ 1 output: the smallest input, ceil_mode, padding, a smaller kernel.

    ``dims`` holds ``(L, k, s, p, d, out)`` per real dim; ``can_pad``: the op has padding and more
    of it would count (not LPPool, not AvgPool3d's input ≥ kernel rule).
    """
    need, ceil_helps, pad_need = [], True, []
    for L, k, s, p, d, out in dims:
        E = effective_kernel(k, d)
        # floor: L + 2p − E ≥ 0; ceil: L + 2p − E + s − 1 ≥ 0 (the first window always starts inside)
        need.append(max(1, E - 2 * p - (s - 1 if ceil else 0)))
        if out < 1:
            ceil_helps = ceil_helps and pool_out(L, k, s, p, d, True)[0] >= 1
            p_min = math.ceil((E - L) / 2)
            pad_need.append(p_min if p_min <= k // 2 else None)
    fixes = [f"input ≥ {need[0] if len(set(need)) == 1 else tuple(need)} in every dim"]
    if not ceil and ceil_helps:
        fixes.append("ceil_mode=True")
    if can_pad and pad_need and None not in pad_need:
        fixes.append(f"padding ≥ {max(pad_need)} (at most kernel_size // 2)")
    fixes.append("a smaller kernel_size")
    return fixes

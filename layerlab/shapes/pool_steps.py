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
from typing import List, Optional, Sequence, Tuple

from layerlab.shapes.arith import effective_kernel, pool_out, unread_pixels
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
            f"{name}: ceil_mode adds window {out - 1} (floor mode gives {floor_out}); it starts at padded "
            f"position {start} and reads {past} position(s) past the end of the padded input, "
            "which are ignored.",
            dim=name, severity="info", data={"window": out - 1, "start": start, "past_end": past},
        ))


def dim_notes(ex: Explanation, name: str, L: int, k: int, s: int, p: int, d: int, n: int, ceil: bool) -> None:
    """All notes of one valid dim: ceil mode's extra/dropped window, unread pixels."""
    if ceil:
        _ceil_notes(ex, name, L, k, s, p, d)
    _pixel_notes(ex, name, L, k, s, p, d, n)


#: Notes list the unread pixels up to this many (the count is always exact) ...
MAX_LISTED_PIXELS = 100_000
#: ... and name this many ranges of them in the message.
_SHOWN_RANGES = 8


def _lost_pixels(L: int, k: int, s: int, p: int, d: int, n: int) -> Optional[Tuple[range, int, List[range]]]:
    """Unread real pixels: (the tail at the end, how many others, those others as ranges — only the
    first ones when there are many), or ``None`` when too costly to find (huge dilated inputs)."""
    if d == 1:
        # Window j reads [j·s − p, j·s − p + k); the first covers pixel 0 (p ≤ k // 2) and the last
        # starts inside the input: the lost pixels are the n − 1 gaps of s − k between windows, and a tail.
        tail = range(max(0, (n - 1) * s - p + k), L)
        if s <= k or n < 2:
            return tail, 0, []
        count = (n - 1) * (s - k)
        shown = n - 1 if count <= MAX_LISTED_PIXELS else min(n - 1, _SHOWN_RANGES + 1)
        return tail, count, [range(j * s - p + k, (j + 1) * s - p) for j in range(shown)]
    if n * k > 2_000_000:
        return None
    lost = unread_pixels(L, k, s, p, d, n)
    cut = len(lost)
    while cut and lost[cut - 1] == L - len(lost) + cut - 1:  # the run that ends at pixel L − 1
        cut -= 1
    tail = range(lost[cut], L) if cut < len(lost) else range(0)
    return tail, cut, _merge([range(x, x + 1) for x in lost[:cut]])


def _merge(ranges: List[range]) -> List[range]:
    """Adjacent ranges joined (dilation holes come one pixel at a time)."""
    out: List[range] = []
    for r in ranges:
        if out and out[-1].stop == r.start:
            out[-1] = range(out[-1].start, r.stop)
        else:
            out.append(r)
    return out


def _text(ranges: List[range], more: bool = False) -> str:
    parts = [str(r.start) if len(r) == 1 else f"{r.start}-{r[-1]}" for r in ranges[:_SHOWN_RANGES]]
    return ", ".join(parts) + (", …" if more or len(ranges) > _SHOWN_RANGES else "")


def _pixel_notes(ex: Explanation, name: str, L: int, k: int, s: int, p: int, d: int, n: int) -> None:
    """``cropped`` (unread pixels at the end) and ``skipped`` (unread pixels between windows)."""
    found = _lost_pixels(L, k, s, p, d, n)
    if found is None:
        return
    tail, count, gaps = found
    if len(tail):
        ex.notes.append(ShapeNote(
            "cropped",
            f"{name}: {len(tail)} real pixel(s) at the end are never read (index {_text([tail])} of 0-{L - 1}): "
            "the last window ends before them.",
            dim=name, data={"pixels": list(tail) if len(tail) <= MAX_LISTED_PIXELS else None, "count": len(tail)},
        ))
    if count:
        E = effective_kernel(k, d)
        why = f"stride {s} > effective kernel {E}" if s > E else f"dilation {d} leaves holes that no window covers"
        listed = count <= MAX_LISTED_PIXELS
        ex.notes.append(ShapeNote(
            "skipped",
            f"{name}: {count} real pixel(s) between windows are never read (index {_text(gaps, not listed)}): {why}.",
            dim=name, data={"pixels": [x for g in gaps for x in g] if listed else None, "count": count},
        ))


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

"""Which real input pixels no window reads — the notes ``cropped`` and ``skipped`` (shape_rules.md §14.4).

Window ``j`` of a conv / unfold reads the padded positions ``j·s + i·d`` (``i < k``); in real
coordinates (``x = position − p_left``) that is ``j·s − p_left + i·d``. A real pixel nobody reads
either lies at or after ``n_out·s − p_left`` — where the window the floor dropped would have
started: *cropped* — or between windows (stride > effective kernel) or in dilation holes that
no other window covers: *skipped*. With ``padding_mode`` other than zeros, positions in the
padding read the real pixel they copy. The set matches the input positions with zero gradient.
"""

from __future__ import annotations

from typing import List, Optional

from layerlab.shapes.arith import describe_ranges, effective_kernel
from layerlab.shapes.fpad import source_index
from layerlab.shapes.result import ShapeNote

#: Above this many window reads per dim the notes are skipped.
_SCAN_LIMIT = 50_000_000
#: At most this many pixel indices go into a note's ``data`` (``count`` has the total).
_DATA_LIMIT = 10_000


def read_pixels(L: int, k: int, s: int, pl: int, d: int, n_out: int, mode: str = "zeros") -> Optional[bytearray]:
    """``mark[x] == 1`` for every real pixel ``x`` some window reads.

    Tap ``i`` of the ``n_out`` windows reads the real positions ``−pl + i·d + j·s`` — an arithmetic
    progression, marked with one slice. Positions in the padding read the pixel they copy
    (``padding_mode``) or nothing (zeros). None when the scan would be absurdly long.
    """
    if k * n_out > _SCAN_LIMIT:
        return None
    mark = bytearray(L)
    for i in range(k):
        x0 = -pl + i * d
        j_lo = max(0, -(x0 // s))  # first j with x0 + j·s ≥ 0
        j_hi = min(n_out - 1, (L - 1 - x0) // s)  # last j with x0 + j·s ≤ L − 1
        if j_lo <= j_hi:
            start, stop = x0 + j_lo * s, x0 + j_hi * s + 1
            mark[start:stop:s] = b"\x01" * (j_hi - j_lo + 1)
        if mode != "zeros":  # taps in the padding: few, as the padding is smaller than the input
            for j in list(range(0, min(j_lo, n_out))) + list(range(max(j_hi + 1, 0), n_out)):
                mark[source_index(x0 + j * s, L, mode)] = 1
    return mark


def unread_count(L: int, k: int, s: int, pl: int, d: int, n_out: int, mode: str = "zeros") -> Optional[int]:
    """How many real pixels no window reads (``None`` when too long to scan)."""
    if L <= 0 or n_out <= 0:
        return max(L, 0)
    mark = read_pixels(L, k, s, pl, d, n_out, mode)
    return None if mark is None else mark.count(0)


def _ranges(indices: List[int], limit: int = 8) -> str:
    text = describe_ranges(indices)
    parts = text.split(", ")
    return text if len(parts) <= limit else ", ".join(parts[:limit]) + f", … ({len(parts) - limit} more ranges)"


def unread_notes(dim: str, L: int, k: int, s: int, pl: int, d: int, n_out: int,
                 mode: str = "zeros") -> List[ShapeNote]:
    """``cropped`` (the floor drops the window that would read them) and ``skipped`` (gaps) notes.

    A pixel at or after ``n_out·s − pl`` (where the next, dropped, window would start) is
    *cropped*; any other unread pixel lies between windows (stride > E) or in dilation holes.
    """
    if L <= 0 or n_out <= 0:
        return []
    mark = read_pixels(L, k, s, pl, d, n_out, mode)
    if mark is None:
        return [ShapeNote("info", f"{dim}: too large to list the pixels that no window reads", dim=dim,
                          severity="info")]
    if mark.count(0) == 0:
        return []
    next_start = n_out * s - pl
    unread = [x for x, v in enumerate(mark) if not v]
    cropped = [x for x in unread if x >= next_start]
    skipped = [x for x in unread if x < next_start]
    E = effective_kernel(k, d)
    notes = []
    if skipped:
        why = (f"stride {s} > effective kernel {E}: the {s - E} pixel(s) between consecutive windows are never read"
               if s > E else f"dilation {d} leaves holes inside each window that no other window covers")
        notes.append(ShapeNote(
            "skipped", f"{dim}: {why} — {len(skipped)} of {L} pixels: {_ranges(skipped)}", dim=dim,
            data={"pixels": skipped[:_DATA_LIMIT], "count": len(skipped), "stride": s, "effective_kernel": E}))
    if cropped:
        notes.append(ShapeNote(
            "cropped",
            f"{dim}: the floor drops the last partial window, so {len(cropped)} pixel(s) at the end are never "
            f"read: {_ranges(cropped)} (of 0-{L - 1})", dim=dim,
            data={"pixels": cropped[:_DATA_LIMIT], "count": len(cropped),
                  "leftover": (L + 2 * pl - E) % s if s > 0 else 0}))
    return notes

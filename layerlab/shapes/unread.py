"""Which real input pixels no window reads — the notes ``cropped`` and ``skipped`` (shape_rules.md §14.4).

Window ``j`` of a conv / unfold reads the padded positions ``j·s + i·d`` (``i < k``); in real
coordinates (``x = position − p_left``) that is ``j·s − p_left + i·d``. A real pixel nobody reads
either lies at or after ``n_out·s − p_left`` — where the window the floor dropped would have
started: *cropped* — or between windows (stride > effective kernel) or in dilation holes that
no other window covers: *skipped*. With ``padding_mode`` other than zeros, positions in the
padding read the real pixel they copy. The set matches the input positions with zero gradient.

How it is computed — never in time or memory proportional to ``L`` when the windows have no
holes (``d = 1`` or ``k = 1``, by far the common case): each window is then the interval
``[j·s − p_left, j·s − p_left + E)``, so "how many pixels below ``X`` are read" has a closed
form and the unread ranges (the gaps between windows, the cropped tail) are generated lazily.
A conv1d over 2^40 samples costs the same as one over 32. Dilated windows (holes) are marked in
a byte per pixel, only up to :data:`MARK_LIMIT` pixels; beyond it the notes say so.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from itertools import islice
from typing import Iterator, List, Optional, Sequence, Tuple

from layerlab.shapes.arith import effective_kernel
from layerlab.shapes.fpad import source_index
from layerlab.shapes.result import ShapeNote

#: Dilated windows: above this many window reads per dim the notes are skipped.
_SCAN_LIMIT = 50_000_000
#: Dilated windows: above this many input pixels (one byte each) the notes are skipped.
MARK_LIMIT = 1 << 24
#: Non-zero padding_mode: above this many padded positions per side the notes are skipped.
_PAD_LIMIT = 1 << 16
#: At most this many pixel indices go into a note's ``data`` (``count`` has the total).
_DATA_LIMIT = 10_000
#: Ranges are counted for the message up to this many (then "more than …").
_RANGE_COUNT_LIMIT = 10_000

_ZERO_RUNS = re.compile(rb"\x00+")

Range = Tuple[int, int]  # [start, stop)


class _Windows:
    """Windows without holes: ``[j·s − pl, j·s − pl + E)`` for ``j < n``; ``extra`` = pixels
    read through the padding (sorted). Counting is O(1) (plus ``len(extra)``)."""

    def __init__(self, L: int, E: int, s: int, pl: int, n: int, extra: Sequence[int] = ()) -> None:
        self.L, self.E, self.s, self.pl, self.n = L, E, s, pl, n
        self.extra = sorted(set(x for x in extra if 0 <= x < L and not self._window_read(x)))

    def _covered_below(self, y: int) -> int:
        """How many real-coordinate positions below ``y`` some window covers (padding included)."""
        u = y + self.pl  # padded coordinate
        E, s, n = self.E, self.s, self.n
        if u <= 0 or n <= 0:
            return 0
        if s < E:  # overlapping windows: one interval [0, (n−1)·s + E)
            return min(u, (n - 1) * s + E)
        full = 0 if u < E else min(n, (u - E) // s + 1)
        part = min(max(u - full * s, 0), E) if full < n else 0
        return full * E + part

    def _window_read(self, x: int) -> bool:
        return _in_window(x, self.E, self.s, self.pl, self.n)

    def count(self, lo: int, hi: int) -> int:
        lo, hi = max(lo, 0), min(hi, self.L)
        if hi <= lo:
            return 0
        unread = (hi - lo) - (self._covered_below(hi) - self._covered_below(lo))
        return unread - (bisect_left(self.extra, hi) - bisect_left(self.extra, lo))

    def _window_gaps(self, lo: int, hi: int) -> Iterator[Range]:
        E, s, n, pl = self.E, self.s, self.n, self.pl
        first = -pl
        if n <= 0:
            yield lo, hi
            return
        if first > lo:
            yield lo, min(first, hi)
        if s < E:
            tail = (n - 1) * s - pl + E
            if tail < hi:
                yield max(tail, lo), hi
            return
        j = max(0, (lo + pl - E) // s)
        while j < n:
            start = j * s - pl + E
            stop = (j + 1) * s - pl if j < n - 1 else hi
            if start >= hi:
                return
            a, b = max(start, lo), min(stop, hi)
            if a < b:
                yield a, b
            j += 1

    def ranges(self, lo: int, hi: int) -> Iterator[Range]:
        lo, hi = max(lo, 0), min(hi, self.L)
        if hi <= lo:
            return
        for a, b in self._window_gaps(lo, hi):
            i = bisect_left(self.extra, a)
            while i < len(self.extra) and self.extra[i] < b:  # punch out pixels read through the padding
                if self.extra[i] > a:
                    yield a, self.extra[i]
                a = self.extra[i] + 1
                i += 1
            if a < b:
                yield a, b


class _Marks:
    """Any windows (dilation holes): one byte per pixel, 1 where some window reads it."""

    def __init__(self, mark: bytearray) -> None:
        self.mark = mark

    def count(self, lo: int, hi: int) -> int:
        lo, hi = max(lo, 0), min(hi, len(self.mark))
        return self.mark.count(0, lo, hi) if hi > lo else 0

    def ranges(self, lo: int, hi: int) -> Iterator[Range]:
        lo, hi = max(lo, 0), min(hi, len(self.mark))
        for m in _ZERO_RUNS.finditer(self.mark, lo, max(hi, lo)):
            yield m.start(), m.end()


def _in_window(x: int, E: int, s: int, pl: int, n: int) -> bool:
    """Does some hole-free window cover real coordinate ``x`` (which may lie in the padding)?"""
    u = x + pl
    if u < 0 or n <= 0:
        return False
    if s < E:
        return u < (n - 1) * s + E
    j = u // s
    return j < n and u - j * s < E


def _padding_reads(L: int, E: int, s: int, pl: int, n: int, mode: str) -> Optional[List[int]]:
    """Hole-free windows: the real pixels read through padding positions (None: too many)."""
    if mode == "zeros":
        return []
    last = (n - 1) * s - pl + E  # end (exclusive) of the last window, real coordinates
    left, right = range(-pl, min(0, last)), range(max(L, -pl), last)
    if len(left) > _PAD_LIMIT or len(right) > _PAD_LIMIT:
        return None
    return [source_index(x, L, mode) for x in (*left, *right) if _in_window(x, E, s, pl, n)]


def unread_set(L: int, k: int, s: int, pl: int, d: int, n_out: int, mode: str = "zeros"):
    """The unread pixels as an object with ``count(lo, hi)`` and ``ranges(lo, hi)``; None when
    too large to work out (dilated windows over a huge input)."""
    E = effective_kernel(k, d)
    if s <= 0 or k <= 0:
        return None
    if d == 1 or k == 1:
        extra = _padding_reads(L, E, s, pl, n_out, mode)
        return None if extra is None else _Windows(L, E, s, pl, n_out, extra)
    if k * n_out > _SCAN_LIMIT or L > MARK_LIMIT:
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
                src = source_index(x0 + j * s, L, mode)
                if src >= 0:
                    mark[src] = 1
    return _Marks(mark)


def unread_count(L: int, k: int, s: int, pl: int, d: int, n_out: int, mode: str = "zeros") -> Optional[int]:
    """How many real pixels no window reads (``None`` when too large to work out)."""
    if L <= 0 or n_out <= 0:
        return max(L, 0)
    u = unread_set(L, k, s, pl, d, n_out, mode)
    return None if u is None else u.count(0, L)


def _pixels(ranges: Iterator[Range], limit: int = _DATA_LIMIT) -> List[int]:
    out: List[int] = []
    for a, b in ranges:
        out.extend(range(a, min(b, a + limit - len(out))))
        if len(out) >= limit:
            break
    return out


def _describe(u, lo: int, hi: int, limit: int = 8) -> str:
    """The first ``limit`` ranges as ``2-4, 7-9``, and how many more there are."""
    head = list(islice(u.ranges(lo, hi), limit + _RANGE_COUNT_LIMIT))
    text = ", ".join(str(a) if a == b - 1 else f"{a}-{b - 1}" for a, b in head[:limit])
    more = len(head) - limit
    if more <= 0:
        return text
    return text + (f", … ({more} more ranges)" if len(head) < limit + _RANGE_COUNT_LIMIT
                   else f", … (more than {_RANGE_COUNT_LIMIT} more ranges)")


def unread_notes(dim: str, L: int, k: int, s: int, pl: int, d: int, n_out: int,
                 mode: str = "zeros") -> List[ShapeNote]:
    """``cropped`` (the floor drops the window that would read them) and ``skipped`` (gaps) notes.

    A pixel at or after ``n_out·s − pl`` (where the next, dropped, window would start) is
    *cropped*; any other unread pixel lies between windows (stride > E) or in dilation holes.
    """
    if L <= 0 or n_out <= 0:
        return []
    u = unread_set(L, k, s, pl, d, n_out, mode)
    if u is None:
        return [ShapeNote("info", f"{dim}: too large to list the pixels that no window reads", dim=dim,
                          severity="info")]
    if u.count(0, L) == 0:
        return []
    next_start = min(max(n_out * s - pl, 0), L)
    n_skipped, n_cropped = u.count(0, next_start), u.count(next_start, L)
    E = effective_kernel(k, d)
    notes = []
    if n_skipped:
        why = (f"stride {s} > effective kernel {E}: the {s - E} pixel(s) between consecutive windows are never read"
               if s > E else f"dilation {d} leaves holes inside each window that no other window covers")
        notes.append(ShapeNote(
            "skipped", f"{dim}: {why} — {n_skipped} of {L} pixels: {_describe(u, 0, next_start)}", dim=dim,
            data={"pixels": _pixels(u.ranges(0, next_start)), "count": n_skipped, "stride": s,
                  "effective_kernel": E}))
    if n_cropped:
        notes.append(ShapeNote(
            "cropped",
            f"{dim}: the floor drops the last partial window, so {n_cropped} pixel(s) at the end are never "
            f"read: {_describe(u, next_start, L)} (of 0-{L - 1})", dim=dim,
            data={"pixels": _pixels(u.ranges(next_start, L)), "count": n_cropped,
                  "leftover": (L + 2 * pl - E) % s if s > 0 else 0}))
    return notes

"""What shape a difference has: the clue that turns "the output differs" into "this is the bug".

Given what the layer computed and what the reference computed (float64, so any difference is the
maths), :func:`pattern` looks for, in this order:

* a **constant ratio** ``ours / reference = c`` everywhere: a scale factor. ``c`` is matched with
  the factors bugs produce: ``N/(N−1)`` and ``√(N/(N−1))`` (unbiased instead of biased variance,
  N a size of the tensor or of the layer), ``√N`` (a missing ``1/√d`` scale), 2 and ½ (a dropped
  factor), −1 (a sign);
* a **constant offset**: a bias added twice or not at all;
* a **transposed** result (the gradient of a weight used as ``x @ W`` instead of ``x @ W.T`` is
  the reference's gradient transposed);
* a **localised** difference: only some indices along a dim differ: for a stacked RNN weight
  (``3H``/``4H`` rows) which gate block, along the time dim the first/last position or the borders,
  otherwise which rows / channels.

Each :class:`Pattern` carries a hint that follows from what was seen and nothing else: when no
pattern is found, :func:`pattern` returns ``None`` and the caller says so rather than guessing.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

#: torch's order of the gate blocks stacked in an RNN weight, by number of blocks and reference class
GATES = {"LSTM": ("i", "f", "g", "o"), "LSTMCell": ("i", "f", "g", "o"),
         "GRU": ("r", "z", "n"), "GRUCell": ("r", "z", "n")}


@dataclass
class Pattern:
    """A regularity in the difference between ours and the reference.

    Attributes:
        kind: ``ratio``, ``offset``, ``transposed``, ``row_ratio``, ``normalised_axis``, ``shifted``,
            ``gates``, ``positions`` or ``indices``.
        text: what was seen (``constant ratio 0.9354 ≈ √((N−1)/N) with N=8``).
        hint: what it points to (never a cause the pattern does not show).
        details: the numbers (JSON-ready).
    """

    kind: str
    text: str
    hint: str
    details: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return {"kind": self.kind, "text": self.text, **self.details}


def mismatch(actual: Tensor, expected: Tensor, rtol: float = 1e-7, atol: float = 1e-7) -> Tensor:
    """Elements that differ beyond ``assert_close``'s float64 tolerance (NaN counts as differing)."""
    a, e = actual.detach().double(), expected.detach().double()
    return ~((a - e).abs() <= atol + rtol * e.abs())


def pattern(actual: Optional[Tensor], expected: Optional[Tensor], *, sizes: Sequence[int] = (),
            time_dim: Optional[int] = None, gates: Optional[Tuple[str, ...]] = None,
            tol: Optional[Tuple[float, float]] = None) -> Optional[Pattern]:
    """The first pattern the difference ``actual − expected`` shows (see the module docstring), or ``None``.

    ``sizes`` are extra N to try for variance factors (the layer's feature sizes); ``time_dim`` the
    sequence dim of an output; ``gates`` torch's gate names when ``actual`` is a stacked RNN weight.
    ``tol`` ``(rtol, atol)``: the rounding the comparison allows (float32 islands in a float64 run,
    :mod:`layerlab.checks.precision`); elements within it are noise, not part of any pattern, and when
    no element is beyond it there is no pattern to describe. Default: float64's ``(1e-7, 1e-7)``.
    """
    if actual is None or expected is None or actual.shape != expected.shape or actual.numel() == 0:
        return None
    a, e = actual.detach().double(), expected.detach().double()
    if not torch.isfinite(a).all() or not torch.isfinite(e).all():
        return None
    bad = mismatch(a, e) if tol is None else mismatch(a, e, rtol=tol[0], atol=tol[1])
    if not bad.any():
        return None
    sizes = sorted({int(n) for n in list(sizes) + list(a.shape) if int(n) > 1})
    for find in (_ratio, _offset):
        found = find(a, e, sizes)
        if found:
            return found
    if a.dim() == 2 and a.shape[0] == a.shape[1] and a.shape[0] > 1 and not mismatch(a, e.t()).any():
        return Pattern("transposed", "equals the reference's transposed",
                       "the tensor is used transposed: x @ W where the reference computes x @ W.T "
                       "(or W stored as (in, out))")
    return _row_ratio(a, e) or _normalised_axis(a, e) or _shifted(a, e) or _localised(bad, gates, time_dim)


def _standardised_along(t: Tensor, dim: int) -> bool:
    """Mean 0 and (biased) variance 1 along ``dim`` in every slice: what a norm with an identity
    affine (its initial weight 1 and bias 0) outputs along the dims it normalises. Variance within 2 %
    of 1 (eps moves it below 1 for slices of small spread), mean within 1e-6 of 0."""
    if t.shape[dim] < 3:
        return False
    mean, var = t.mean(dim), t.var(dim, unbiased=False)
    return bool(mean.abs().max() <= 1e-6 and (var - 1).abs().max() <= 0.02)


def _normalised_axis(a: Tensor, e: Tensor) -> Optional[Pattern]:
    """The reference is standardised along one dim and ours along another: a norm that reduces over
    the wrong axis (``x.mean(1)`` on ``(B, T, C)`` where LayerNorm reduces over ``C``)."""
    if a.dim() < 2:
        return None
    ref = [d for d in range(a.dim()) if _standardised_along(e, d)]
    ours = [d for d in range(a.dim()) if _standardised_along(a, d)]
    if len(ref) != 1 or not ours or ref[0] in ours:
        return None
    want, got = ref[0] - a.dim(), ours[0] - a.dim()
    return Pattern("normalised_axis", f"ours has mean 0 and variance 1 along dim {got} (size {a.shape[got]}), the "
                   f"reference along dim {want} (size {a.shape[want]})",
                   f"the statistics are taken over the wrong axis: reduce over dim {want} (mean/var(dim={want}, "
                   f"keepdim=True)), not dim {got}", {"ours_dim": got, "reference_dim": want})


def _row_ratio(a: Tensor, e: Tensor) -> Optional[Pattern]:
    """Each row (last dim) is the reference's times its own factor, and the factors differ between rows:
    what a norm divides by (its per-row statistic) is computed differently; the numerator agrees."""
    if a.dim() < 2 or a.shape[-1] < 3:
        return None
    rows_a, rows_e = a.reshape(-1, a.shape[-1]), e.reshape(-1, e.shape[-1])
    scale = float(rows_e.abs().max()) or 1.0
    if (rows_e.abs() <= 1e-6 * scale).any():
        return None  # a ratio needs every reference element away from 0
    r = rows_a / rows_e
    c = r.median(dim=-1, keepdim=True).values
    if float(((r - c).abs() / c.abs().clamp_min(1e-300)).max()) > 1e-6:
        return None
    c = c.flatten()
    if float((c - c.median()).abs().max()) <= 1e-6 * float(c.abs().median()):
        return None  # one factor everywhere: that is the constant ratio, found before
    return Pattern("row_ratio", f"ours/reference is constant along the last dim within each row but differs between "
                   f"rows ({float(c.min()):.4g} … {float(c.max()):.4g})",
                   "the per-row statistic the output is divided by differs (mean of squares vs variance, eps "
                   "inside vs outside the square root, a different reduction); what it divides agrees",
                   {"row_ratio_min": float(c.min()), "row_ratio_max": float(c.max())})


def _shifted(a: Tensor, e: Tensor) -> Optional[Pattern]:
    """Away from the borders, ours equals the reference moved by a few positions along the spatial dims
    (those after (B, C)): the padding is put on the wrong side, or an index is off by one."""
    dims = list(range(2, a.dim()))
    if not dims or len(dims) > 3 or any(a.shape[d] < 4 for d in dims):
        return None
    scale = float(e.abs().max()) or 1.0
    for shift in itertools.product(range(-2, 3), repeat=len(dims)):
        if not any(shift):
            continue
        sa, se = a, e
        for d, k in zip(dims, shift):  # ours at i equals the reference at i − k
            n = a.shape[d]
            sa = sa.narrow(d, max(k, 0), n - abs(k))
            se = se.narrow(d, max(-k, 0), n - abs(k))
        if float((sa - se).abs().max()) <= 1e-7 * scale:
            moved = ", ".join(f"dim {d} by {k:+d}" for d, k in zip(dims, shift) if k)
            return Pattern("shifted", f"away from the borders ours equals the reference shifted ({moved})",
                           "the output is displaced: padding applied on one side (or unevenly), an off-by-one in "
                           "the window start, or a wrong crop", {"shift": list(shift), "dims": dims})
    return None


def _ratio(a: Tensor, e: Tensor, sizes: List[int]) -> Optional[Pattern]:
    scale = e.abs().max()
    if scale == 0:
        return None
    big = e.abs() > 1e-6 * scale
    if int(big.sum()) < 2 or (a[~big].abs() > 1e-6 * scale).any():
        return None
    r = a[big] / e[big]
    c = float(r.median())
    # "constant" only if the spread is small next to how far c is from 1 too: a ratio of 0.99999 that
    # varies by 1e-5 between rows (another eps under a norm's square root) is not one factor
    spread = float((r - c).abs().max())
    if abs(c - 1) < 1e-6 or spread > 1e-4 * abs(c) or spread > 1e-2 * abs(c - 1):
        return None
    name, hint = _explain_factor(c, sizes)
    text = f"constant ratio ours/reference = {c:.5g}" + (f" ≈ {name}" if name else "")
    return Pattern("ratio", text, hint, {"ratio": c, "factor": name})


def _explain_factor(c: float, sizes: List[int]) -> Tuple[Optional[str], str]:
    """Name the factor ``c`` when a common bug produces it (plain factors first: a ratio of 2 is
    "a factor 2", not N/(N−1) with N = 2)."""
    close = lambda x: abs(c - x) <= 1e-3 * abs(x)  # noqa: E731
    for value, name, hint in ((2.0, "2", "a factor 2 too many"), (0.5, "½", "a factor 2 dropped"),
                              (-1.0, "−1", "a sign flipped")):
        if close(value):
            return name, hint
    for n in (n for n in sizes if n >= 3):
        for value, name in ((n / (n - 1), f"N/(N−1) with N={n}"), ((n - 1) / n, f"(N−1)/N with N={n}"),
                            (math.sqrt(n / (n - 1)), f"√(N/(N−1)) with N={n}"),
                            (math.sqrt((n - 1) / n), f"√((N−1)/N) with N={n}")):
            if close(value):
                return name, (f"unbiased variance (÷(N−1)) where the reference uses the biased one (÷N), N={n}? "
                              "torch's norms use x.var(dim, unbiased=False)")
    for n in sizes:
        for value, name in ((math.sqrt(n), f"√N with N={n}"), (1 / math.sqrt(n), f"1/√N with N={n}")):
            if close(value):
                return name, f"a 1/√{n} scale missing or applied twice (e.g. attention's 1/√d_head)?"
    if abs(c - 1) < 1e-3:  # too close to 1 for a missing scale: a small constant differs
        return None, (f"every element is off by the same factor {c:.7g}, within 0.1% of 1: a small constant "
                      "differs (an eps inside a norm's square root, a scale near 1)")
    return None, f"every element is off by the same factor {c:.5g}: a scale is missing or wrong"


def _offset(a: Tensor, e: Tensor, sizes: List[int]) -> Optional[Pattern]:
    d = a - e
    c = float(d.flatten()[0])
    scale = float(e.abs().max()) or 1.0
    if abs(c) <= 1e-7 * scale or float((d - c).abs().max()) > 1e-6 * max(abs(c), 1e-12):
        return None
    return Pattern("offset", f"constant offset ours − reference = {c:.5g}",
                   "every element is shifted by the same amount: a bias or constant added where the reference "
                   "adds none (or added twice)", {"offset": c})


def _localised(bad: Tensor, gates: Optional[Tuple[str, ...]], time_dim: Optional[int]) -> Optional[Pattern]:
    if gates and bad.dim() >= 1 and bad.shape[0] % len(gates) == 0:
        k = len(gates)
        H = bad.shape[0] // k
        blocks = [g for i, g in enumerate(gates) if bad[i * H:(i + 1) * H].any()]
        if len(blocks) < k:
            return Pattern("gates", f"only gate block(s) {', '.join(blocks)} differ (torch stacks "
                                    f"({', '.join(gates)}), {H} rows each)",
                           f"look at how gate(s) {', '.join(blocks)} are computed or where their rows are read from",
                           {"gates": blocks, "order": list(gates)})
    if time_dim is not None and 0 <= time_dim < bad.dim() and bad.shape[time_dim] > 2:
        T = bad.shape[time_dim]
        rows = _indices(bad, time_dim)
        if rows == [T - 1]:
            return Pattern("positions", f"only the last position (t = {T - 1}) differs",
                           "only the last step is computed differently: the end of the sequence (padding on "
                           "the right, an off-by-one loop end, the final state written to the output)",
                           {"positions": rows, "dim": time_dim})
        if rows == [0]:
            return Pattern("positions", "only the first position (t = 0) differs",
                           "only the first step is computed differently: the start of the sequence (initial state, "
                           "left padding, a shifted window)", {"positions": rows, "dim": time_dim})
        if rows == [0, T - 1]:
            return Pattern("positions", f"only the border positions (t = 0 and t = {T - 1}) differ",
                           "only the borders differ: how the sequence is padded (zeros vs replicate/reflect, "
                           "or the amount of padding)", {"positions": rows, "dim": time_dim})
    for dim in range(bad.dim()):
        rows = _indices(bad, dim)
        if bad.shape[dim] > 1 and len(rows) < bad.shape[dim]:
            return Pattern("indices", f"only indices {_ranges(rows)} of {bad.shape[dim]} along dim {dim} differ",
                           f"the difference is confined to indices {_ranges(rows)} of {bad.shape[dim]} along dim "
                           f"{dim}: find what treats them apart from the others", {"dim": dim, "indices": rows[:64]})
    return None


def _indices(bad: Tensor, dim: int) -> List[int]:
    other = [d for d in range(bad.dim()) if d != dim]
    hit = bad.any(dim=other[0], keepdim=True) if other else bad
    for d in other[1:]:
        hit = hit.any(dim=d, keepdim=True)
    return [i for i, v in enumerate(hit.reshape(-1).tolist()) if v]


def _ranges(rows: List[int]) -> str:
    spans, start = [], None
    for i, r in enumerate(rows):
        if start is None:
            start = r
        if i + 1 == len(rows) or rows[i + 1] != r + 1:
            spans.append(f"{start}" if start == r else f"{start}–{r}")
            start = None
    return ", ".join(spans[:8]) + (" …" if len(spans) > 8 else "")

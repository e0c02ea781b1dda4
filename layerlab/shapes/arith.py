"""The integer arithmetic behind every conv/pool-type output size, exactly as ATen computes it.

Pure Python, no torch. Each function works on one spatial dimension; the op modules apply them
per dim. Symbols follow ../shared/shape_rules.md §0:

    L  input size      k  kernel size     s  stride     p  padding (each side)
    d  dilation        E  effective kernel d·(k−1)+1    op output_padding

``//`` is floor division (toward −∞), as ATen's ``div_rtn``; results may be ≤ 0 — validity is
decided by the op modules, which know torch's messages.
"""

from __future__ import annotations

from typing import List, Tuple


def effective_kernel(k: int, d: int = 1) -> int:
    """``E = d·(k−1) + 1``: the span one (dilated) window covers."""
    return d * (k - 1) + 1


def ceil_div(a: int, b: int) -> int:
    """``⌈a/b⌉`` for integers, exact for negative ``a`` too (``−((−a)//b)``)."""
    return -((-a) // b)


def conv_out(L: int, k: int, s: int = 1, p: int = 0, d: int = 1) -> int:
    """Conv / Unfold output size: ``(L + 2p − E) // s + 1``."""
    return (L + 2 * p - effective_kernel(k, d)) // s + 1


def pool_out(L: int, k: int, s: int, p: int = 0, d: int = 1, ceil_mode: bool = False) -> Tuple[int, bool]:
    """Max/Avg/LP pool output size and whether ceil mode's last window was dropped.

    Floor mode is the conv formula. Ceil mode rounds up, then drops the last window if it would
    start at or after ``L + p`` (inside the right padding or past it) — ATen's
    ``pooling_output_shape_pad_lr``.
    """
    E = effective_kernel(k, d)
    if not ceil_mode:
        return (L + 2 * p - E) // s + 1, False
    out = (L + 2 * p - E + (s - 1)) // s + 1
    if (out - 1) * s >= L + p:
        return out - 1, True
    return out, False


def conv_transpose_out(L: int, k: int, s: int = 1, p: int = 0, d: int = 1, output_padding: int = 0) -> int:
    """ConvTranspose output size: ``(L − 1)·s − 2p + d·(k − 1) + output_padding + 1``."""
    return (L - 1) * s - 2 * p + d * (k - 1) + output_padding + 1


def same_padding(k: int, d: int = 1) -> Tuple[int, int]:
    """Left and right padding of ``padding='same'``: total ``d·(k−1)``, the extra pixel at the end."""
    total = d * (k - 1)
    left = total // 2
    return left, total - left


def adaptive_bins(L: int, O: int) -> List[Tuple[int, int]]:
    """The ``[start, end)`` input range each of the ``O`` outputs of an adaptive pool reads."""
    return [((i * L) // O, ceil_div((i + 1) * L, O)) for i in range(O)]


def interpolate_out(L: int, scale: float) -> int:
    """Upsample with ``scale_factor``: ``int(float(L) · scale)`` — a double product truncated."""
    return int(float(L) * float(scale))


def describe_ranges(indices: List[int]) -> str:
    """``[2, 3, 4, 7, 8, 9]`` → ``'2-4, 7-9'`` (a readable list of pixel indices)."""
    if not indices:
        return ""
    parts = []
    start = prev = indices[0]
    for x in indices[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ", ".join(parts)

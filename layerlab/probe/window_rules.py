"""A window (or patch) partition of a map whose size is not a multiple of the window.

Legend: B batch, H/W (and D) the spatial sizes, C channels, ws the window (or patch) size.

Swin's window partition ``x.view(B, H // ws, ws, W // ws, ws, C)`` and ViT's patchify
``x.view(B, C, H // p, p, W // p, p)`` split each spatial axis ``d`` into ``(d // ws, ws)``. When ``d``
is not a multiple of ``ws`` the floor division drops the remainder and the view asks for fewer
elements than the input holds: torch says only "shape '[…]' is invalid for input of size …".

The rule recognises the pattern from the sizes alone, and only where it is unmistakable: the
requested shape is the input's shape with at least two axes each replaced by ``(d // ws, ws)`` for
the *same* ``ws`` (every other axis kept, or ``-1``), and at least one of those ``d`` is not a multiple
of ``ws``. One such axis alone is no window (``x.view(B, T, heads, D // heads)`` with ``D`` not divisible
by ``heads`` has the same arithmetic, and padding the features would be wrong there). Nor is it a
window when a kept axis (not the batch) has the size of a split one: a channels-first map
(B, C, H, W) unpacked as ``B, H, W, C = x.shape`` splits C and H and keeps W — padding the channels
would run. Then both readings are named, and no padding is advised.

The first fix is advice, not a mechanical change: pad the axes up to a multiple of the window with
``F.pad`` (what Swin does, then crops the merged output back), and read ``H``, ``W`` from the padded
tensor. Where the sizes come from and where the crop goes are the model's code, so nothing is re-run.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import torch

from layerlab.engine.rule_registry import register_rule
from layerlab.probe import op_triggers as ops
from layerlab.probe.context import op_at
from layerlab.probe.report import Diagnosis

#: ``(input axis, window)`` for each axis split into ``(d // window, window)``.
Splits = List[Tuple[int, int]]


def _align(shape: Sequence[int], wanted: Sequence[int], i: int = 0, j: int = 0) -> Optional[Splits]:
    """How ``wanted`` arises from ``shape``: each input axis kept (or ``-1``), or split into
    ``(d // w, w)`` with ``w ≥ 2``; ``None`` when it does not (keeping an axis is tried first)."""
    if i == len(shape):
        return [] if j == len(wanted) else None
    d = shape[i]
    if j < len(wanted) and wanted[j] in (d, -1):
        rest = _align(shape, wanted, i + 1, j + 1)
        if rest is not None:
            return rest
    if j + 1 < len(wanted):
        a, w = wanted[j], wanted[j + 1]
        if w >= 2 and a >= 1 and a == d // w:
            rest = _align(shape, wanted, i + 1, j + 2)
            if rest is not None:
                return [(i, w), *rest]
    return None


def _pad_code(var: str, shape: Sequence[int], short: dict) -> str:
    """``F.pad(x, (0, 0, 0, 2, 0, 2))``: F.pad's pairs run from the last axis back to the first padded one."""
    pairs = []
    for axis in range(len(shape) - 1, min(short) - 1, -1):
        pairs += [0, short.get(axis, 0)]
    return f"F.pad({var}, ({', '.join(map(str, pairs))}))"


def _layout_in_doubt(record, shape, wanted, split_axes, kept, ws) -> Diagnosis:
    """A partition that splits some axes and keeps another of the same size: the layout is in doubt."""
    same = ", ".join(f"axis {a} ({shape[a]})" for a in kept)
    return Diagnosis(
        f".{record.op}({', '.join(map(str, wanted))}){op_at(record)} splits the axes {split_axes} of the input "
        f"{shape} into windows of {ws}, and {', '.join(str(shape[a]) for a in split_axes if shape[a] % ws)} is not "
        f"a multiple of {ws}; but it keeps {same}, the size of a split axis: the input may be in another layout "
        f"than the partition reads (a channels-first (B, C, H, W) map unpacked as B, H, W, C)",
        expected=f"the split axes a multiple of {ws}", got=shape, cause="window-size",
        hint=f"check the layout first: for a (B, C, H, W) map, x.permute(0, 2, 3, 1) before the partition; "
             f"only if the axes are right, pad them to a multiple of {ws}",
        rule="window partition: each split axis d becomes (d // ws, ws), exact only when ws divides d",
    )


def requested_shape(failed) -> Optional[List[int]]:
    """The sizes a failed ``view``/``reshape`` asked for (``None`` when they are not plain ints)."""
    sizes = list(failed.args[1:]) or list(failed.kwargs.get("shape", failed.kwargs.get("size", [])) or [])
    if len(sizes) == 1 and isinstance(sizes[0], (list, tuple, torch.Size)):
        sizes = list(sizes[0])
    try:
        return [int(s) for s in sizes]
    except (TypeError, ValueError):
        return None


@register_rule("view/window-partition", stage="op", on=ops.VIEWS, order=410)
def partition(ctx) -> Optional[Diagnosis]:
    """``x.view(B, H // ws, ws, W // ws, ws, C)`` on an ``H`` or ``W`` that the window ``ws`` does not divide."""
    failed = ctx.failed_op
    wanted = requested_shape(failed)
    record = failed.record
    x = failed.args[0] if failed.args and isinstance(failed.args[0], torch.Tensor) else None
    if x is None or wanted is None or "stride" in str(failed.exc) or wanted.count(-1) > 1:
        return None
    shape = list(x.shape)
    splits = _align(shape, wanted)
    windows = {w for _, w in splits or []}
    if not splits or len(splits) < 2 or len(windows) != 1:
        return None
    ws = windows.pop()
    short = {axis: (-shape[axis]) % ws for axis, _ in splits if shape[axis] % ws}
    if not short:
        return None
    split_axes = [a for a, _ in splits]
    kept = [a for a in range(1, len(shape)) if a not in split_axes and shape[a] in {shape[s] for s in split_axes}]
    if kept:
        return _layout_in_doubt(record, shape, wanted, split_axes, kept, ws)
    axes = sorted(short)
    sizes = [shape[a] for a in axes]
    padded = [math.ceil(s / ws) * ws for s in sizes]
    named = ", ".join(map(str, axes))
    crop = ", ".join(f":{shape[a]}" if a in short else ":" for a in range(max(axes) + 1))
    var = record.receiver if record.receiver and record.receiver.isidentifier() else "x"
    pad = _pad_code(var, shape, short)
    asked = math.prod(wanted) if -1 not in wanted else None
    common = math.gcd(*sizes)
    fitting = [w for w in range(2, common) if common % w == 0]
    return Diagnosis(
        f".{record.op}({', '.join(map(str, wanted))}){op_at(record)} splits the axes {split_axes} of the input "
        f"{shape} into windows of {ws}, but {' and '.join(map(str, sorted(set(sizes))))} "
        f"{'is' if len(set(sizes)) == 1 else 'are'} not a multiple of {ws}: "
        + "; ".join(f"axis {a}: {shape[a]} // {ws} = {shape[a] // ws} windows cover {shape[a] // ws * ws}, "
                    f"{shape[a] % ws} left over" for a in axes)
        + (f" — so it asks for {asked} elements of {x.numel()}" if asked is not None else ""),
        expected=f"axes {named} a multiple of {ws}", got=sizes, cause="window-size",
        hint=f"pad axes {named} up to a multiple of the window {ws} ({' × '.join(map(str, sizes))} → "
             f"{' × '.join(map(str, padded))}) before the partition: {var} = {pad}, and read the sizes from the "
             f"padded {var} (as Swin does); after merging the windows back, crop to the original size: {var}[{crop}]",
        alternatives=[f"a window size that divides {' and '.join(map(str, sorted(set(sizes))))}"
                      + (f" ({' or '.join(map(str, fitting))})" if fitting else ""),
                      f"crop the input to {' × '.join(str(s // ws * ws) for s in sizes)} (drops the border)"],
        rule="window partition: each split axis d becomes (d // ws, ws), exact only when ws divides d",
    )

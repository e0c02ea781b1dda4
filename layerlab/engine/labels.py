"""Axis labels: which input or parameter axis each axis of a tensor came from.

Vocabulary used by the whole engine:

    atom    one axis that something made: an input's axis (``input x axis 1``), a parameter's
            axis (``parameter fc.weight axis 0``), a new axis a layer made (the 64 features of an
            Embedding), or a piece of an atom that a view split (heads and head size out of the
            features). Atoms never change; sizes may (a conv shrinks a spatial atom).
    label   what one axis of a tensor holds: a tuple of ``(atom id, size)`` parts, outermost first.
            One part for a plain axis; several for an axis that a view/flatten merged (``B·T``).
            ``None``: unknown (an op the table does not know, a constant made in the forward).

Labels are plain tuples so that the op semantics (:mod:`layerlab.engine.op_semantics`) stay data
and their helpers here stay small: broadcasting (:func:`broadcast`) and regrouping for
view/reshape (:func:`regroup`), the one place that decides whether a view interleaves axes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

Part = Tuple[int, int]  # (atom id, size)
Label = Optional[Tuple[Part, ...]]
Labels = Tuple[Label, ...]


@dataclass
class Atom:
    """One axis something made. ``kind``: ``input``, ``param``, ``new`` (a layer's or an op's new
    axis), ``inserted`` (a size-1 axis added by unsqueeze/None/view), ``piece`` (a view's split of
    ``parent``). ``where`` is the op and source line that made a ``new``/``piece`` atom."""

    id: int
    kind: str
    name: str
    size: int
    parent: Optional[int] = None
    where: Optional[str] = None
    input: Optional[str] = None  # for kind == "input": the input's name
    axis: Optional[int] = None  # for kind == "input"/"param": the axis of that tensor


@dataclass
class Group:
    """One minimal group of a view/reshape: these input parts became these output axes."""

    parts: List[Part] = field(default_factory=list)
    out_axes: List[int] = field(default_factory=list)
    in_axes: List[int] = field(default_factory=list)

    @property
    def regroups(self) -> bool:
        """Several parts (size > 1) re-cut into several output axes."""
        return len([p for p in self.parts if p[1] > 1]) > 1 and len(self.out_axes) > 1

    def interleaves(self, out_sizes: Sequence[int]) -> bool:
        """The group regroups, and some output axis cannot be made of whole parts and an outer
        piece of the next one (a 6 out of parts 4 and 6): its elements mix two input axes.

        A split of one axis whose outer piece joins the axes before it (MobileViT's
        ``(B·C·H/p, p, …)``) is a clean cut and is not counted: sizes alone cannot tell it from a
        mistake, the distinct-size re-run can (a prime-sized axis has no clean cut)."""
        if not self.regroups:
            return False
        parts = [s for _, s in self.parts if s > 1]
        k, left = 0, parts[0]
        for o in (s for s in out_sizes if s > 1):
            while o > 1:
                if left == 1:
                    k += 1
                    if k >= len(parts):
                        return True
                    left = parts[k]
                if o % left == 0:
                    o //= left
                    left = 1
                elif left % o == 0:
                    left //= o
                    o = 1
                else:
                    return True
        return False


def atoms_of(label: Label) -> Tuple[int, ...]:
    return tuple(a for a, _ in label) if label else ()


def size_of(label: Label) -> int:
    n = 1
    for _, s in label or ():
        n *= s
    return n


def plain(atom: int, size: int) -> Label:
    return ((atom, size),)


def resized(label: Label, size: int) -> Label:
    """The same axis at another size (a conv, a pool, a pad, a crop): one part keeps its atom."""
    if label is None:
        return None
    if len(label) == 1:
        return ((label[0][0], size),)
    return None  # a merged axis cut to another size: its parts no longer say what is where


def broadcast(labels: Sequence[Labels], shapes: Sequence[Sequence[int]], out: Sequence[int]) -> Tuple[Labels, list]:
    """Right-aligned broadcasting: the output label of each axis, and ``meets``: for every output
    axis where operands bring two different known labels of size > 1, or a size-1 axis meets a
    larger one, ``(out axis, [(operand, label, size, promoted)])`` (``promoted``: that operand
    has no such axis: broadcasting added it on the left)."""
    n = len(out)
    result: List[Label] = []
    meets = []
    for k in range(n):
        contrib = []
        for i, (lab, shp) in enumerate(zip(labels, shapes)):
            j = k - (n - len(shp))
            if j < 0:
                contrib.append((i, None, None, True))
            else:
                contrib.append((i, lab[j] if lab is not None and j < len(lab) else None, shp[j], False))
        big = [c for c in contrib if c[2] is not None and c[2] == out[k] and out[k] != 1]
        known = [c for c in big if c[1] is not None]
        label = known[0][1] if known else None
        if label is None and out[k] == 1:
            label = next((c[1] for c in contrib if c[1] is not None), None)
        result.append(label)
        distinct = {atoms_of(c[1]) for c in known}
        ones = [c for c in contrib if c[2] == 1 and out[k] != 1]
        if len(distinct) > 1 or (ones and big) or (big and any(c[3] for c in contrib)):
            meets.append((k, contrib))
    return tuple(result), meets


def regroup(label: Labels, shape: Sequence[int], out: Sequence[int], new_piece, join=tuple) -> Tuple[Labels, List[Group]]:
    """Labels after a view/reshape from ``shape`` to ``out`` (same element count), and its groups.

    The input axes are opened into their parts (a merged ``B·T`` axis is the parts B and T), size-1
    parts dropped; parts and output axes are then matched by running products (the unique minimal
    grouping). An output axis equal to one part keeps it; one made of several whole parts in order
    is their merge; a split of one part gives pieces (``new_piece(atom, k, size)``); anything else
    (a group with several parts and several output axes) interleaves and gets unknown labels.
    ``join(parts)`` makes a merged label (it turns pieces merged back in order into their atom).
    """
    parts: List[Tuple[Part, int]] = []  # (part, input axis)
    for axis, (lab, size) in enumerate(zip(label, shape)):
        if size == 1:
            continue
        if lab is None or size_of(lab) != size:
            parts.append(((-1, size), axis))  # unknown axis: one anonymous part
        else:
            parts.extend(((p, axis) for p in lab if p[1] != 1))
    outs = [(k, s) for k, s in enumerate(out) if s != 1]
    result: List[Label] = [None] * len(out)
    groups: List[Group] = []
    i = j = 0
    while i < len(parts) and j < len(outs):
        group = Group()
        pin, pout = parts[i][0][1], outs[j][1]
        group.parts.append(parts[i][0]); group.in_axes.append(parts[i][1]); group.out_axes.append(outs[j][0])
        i += 1; j += 1
        while pin != pout:
            if pin < pout:
                if i >= len(parts):
                    return tuple([None] * len(out)), groups
                pin *= parts[i][0][1]; group.parts.append(parts[i][0]); group.in_axes.append(parts[i][1]); i += 1
            else:
                if j >= len(outs):
                    return tuple([None] * len(out)), groups
                pout *= outs[j][1]; group.out_axes.append(outs[j][0]); j += 1
        groups.append(group)
        known = all(p[0] >= 0 for p in group.parts)
        if len(group.out_axes) == 1:
            result[group.out_axes[0]] = join(group.parts) if known else None
        elif len(group.parts) == 1 and known:
            atom = group.parts[0][0]
            for k, axis in enumerate(group.out_axes):
                result[axis] = plain(new_piece(atom, k, out[axis]), out[axis])
        # else: interleaving or unknown: the output axes' labels stay unknown
    return tuple(result), groups

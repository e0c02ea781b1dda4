"""What a square attention mask says: its encoding, its triangle, and what that means for causality.

torch has three ways to write a mask, and a causal mask is one triangle in each:

* ``bool`` — ``nn.MultiheadAttention`` and the transformer layers read ``True`` = *blocked*
  (causal: ``torch.triu(ones, diagonal=1)``); ``F.scaled_dot_product_attention`` reads ``True`` =
  *may attend* (causal: ``torch.tril(ones)``). The mask alone does not say which reading the
  layer uses, so both are kept and the layer's behaviour decides (:func:`reading_explains`);
* ``additive`` — a float mask of ``0`` and ``−inf`` added to the scores (causal: ``−inf`` on
  ``triu(diagonal=1)``);
* ``float01`` — a float mask of ``0`` and ``1``: torch *adds* it to the scores, so it blocks
  nothing. Its triangle still says what the user meant (1s above the diagonal: 1 = blocked; 1s on
  and below it: 1 = attend).

A :class:`Triangle` is such a mask with its *marked* entries (``True``, ``−inf`` or ``1``) equal to
``torch.triu(ones(T, T), diagonal)`` (``side="upper"``) or ``torch.tril(…)`` (``side="lower"``), for
any diagonal: the off-by-one masks (``diagonal=2``: each position also sees the next;
``diagonal=0``: each position is masked from itself and row 0 from everything) are triangles too.

Legend: T sequence length · t query position · s key position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch
from torch import Tensor

#: below this a float mask entry counts as −inf (blocked); HF writes ``finfo.min`` instead of −inf
BLOCK_BELOW = -1e4
#: the bool readings, as the masks check names them
TRUE_BLOCKS = "True = blocked (nn.MultiheadAttention's convention)"
TRUE_ATTENDS = "True = attend (scaled_dot_product_attention's convention)"


@dataclass(frozen=True)
class Triangle:
    """A ``(T, T)`` mask whose marked entries form ``triu``/``tril`` of ``ones(T, T)`` at ``diagonal``."""

    encoding: str  # "bool", "additive" (0 / −inf) or "float01" (0 / 1)
    side: str  # "upper" (triu) or "lower" (tril)
    diagonal: int
    size: int

    @property
    def marked(self) -> Tensor:
        ones = torch.ones(self.size, self.size, dtype=torch.bool)
        return ones.triu(self.diagonal) if self.side == "upper" else ones.tril(self.diagonal)

    def readings(self) -> List[Tuple[str, Tensor]]:
        """``[(reading, blocked)]``: what the mask blocks under each convention that may apply."""
        if self.encoding == "bool":
            return [(TRUE_BLOCKS, self.marked), (TRUE_ATTENDS, ~self.marked)]
        if self.encoding == "additive":
            return [("−inf = blocked", self.marked)]
        return [("float masks are added to the scores", torch.zeros_like(self.marked))]

    def code(self) -> str:
        """The torch expression that builds it."""
        fn = "triu" if self.side == "upper" else "tril"
        if self.encoding == "bool":
            return f"torch.ones(T, T, dtype=torch.bool).{fn}(diagonal={self.diagonal})"
        if self.encoding == "additive":
            return f"float('-inf') on torch.ones(T, T).{fn}(diagonal={self.diagonal}), 0 elsewhere"
        return f"torch.ones(T, T).{fn}(diagonal={self.diagonal}) as a float 0/1 mask"

    @property
    def claims_causal(self) -> bool:
        """Does the mask look like an attempt at a causal mask (exact or off by some diagonals)?"""
        # an additive −inf on the lower triangle blocks the past under every convention: that is an
        # anti-causal (right-to-left) mask, not a causal one; bool and 0/1 triangles depend on the reading
        return self.encoding != "additive" or self.side == "upper"

    @property
    def one_means(self) -> str:
        """For a float 0/1 mask: what its 1s were meant to do, read from the triangle they form."""
        return "blocked" if self.side == "upper" and self.diagonal >= 1 else "attend"


def triangle(t: Any) -> Optional[Triangle]:
    """The :class:`Triangle` that ``t`` is, or ``None`` (not square 2-D, not 0/−inf, 0/1 or bool, not a triangle)."""
    if not isinstance(t, Tensor) or t.dim() != 2 or t.shape[0] != t.shape[1] or t.shape[0] < 2:
        return None
    if t.dtype == torch.bool:
        encoding, marked = "bool", t
    elif t.is_floating_point():
        blocked, ones, zeros = t < BLOCK_BELOW, t == 1, t == 0
        if bool((blocked | zeros).all()) and bool(blocked.any()):
            encoding, marked = "additive", blocked
        elif bool((ones | zeros).all()) and bool(ones.any()):
            encoding, marked = "float01", ones
        else:
            return None
    else:
        return None
    marked = marked.cpu()
    T = t.shape[0]
    if bool(marked.all()) or not bool(marked.any()):
        return None
    rows, cols = torch.nonzero(marked, as_tuple=True)
    offsets = cols - rows  # the diagonal each marked entry lies on
    ones = torch.ones(T, T, dtype=torch.bool)
    for side, k, full in (("upper", int(offsets.min()), ones.triu(int(offsets.min()))),
                          ("lower", int(offsets.max()), ones.tril(int(offsets.max())))):
        if torch.equal(marked, full):
            return Triangle(encoding, side, k, T)
    return None


def is_exactly_causal(tri: Optional[Triangle]) -> bool:
    """A correct causal mask in one of torch's forms (what ``generate_square_subsequent_mask`` or
    ``torch.tril(ones)`` for SDPA gives)."""
    if tri is None:
        return False
    if tri.encoding == "bool":
        return (tri.side, tri.diagonal) in (("upper", 1), ("lower", 0))
    return tri.encoding == "additive" and (tri.side, tri.diagonal) == ("upper", 1)


# -- what a blocked pattern does -------------------------------------------------------------------

def all_blocked_rows(blocked: Tensor) -> List[int]:
    """Query rows with every key blocked: softmax of all −inf, NaN in nn.MultiheadAttention."""
    return [int(i) for i in torch.nonzero(blocked.all(dim=1)).flatten()]


def first_leak(blocked: Tensor) -> Optional[Tuple[int, int]]:
    """``(t, s)``: the first query position that may see a later key, and the first such key."""
    T = blocked.shape[0]
    for t in range(T):
        later = torch.nonzero(~blocked[t, t + 1:]).flatten()
        if later.numel():
            return t, t + 1 + int(later[0])
    return None


def reading_explains(blocked: Tensor, leak: Optional[Tuple[int, int]], nan_rows: List[int]) -> bool:
    """Would a layer that blocks ``blocked`` show what was observed: the first leak ``(t, s)``, or NaN
    at query positions ``nan_rows`` (its all-blocked rows among them)?"""
    if leak is not None:
        return first_leak(blocked) == leak
    empty = all_blocked_rows(blocked)
    return bool(nan_rows) and bool(empty) and set(empty) <= set(nan_rows)


def defect(tri: Triangle, blocked: Tensor) -> Optional[str]:
    """What is wrong with ``tri``, read so that it blocks ``blocked``, as a causal mask (``None``: it is
    exactly causal). Said in terms of the mask as written (its own function and diagonal)."""
    shape = triangle(blocked)
    if shape is None:
        return "it blocks nothing" if not bool(blocked.any()) else "it is not a triangle"
    if shape.side == "lower":
        return ("it is inverted: it blocks the past and leaves the future open (a causal mask in the other "
                "convention)")
    k = shape.diagonal  # blocked = triu(k); causal is k = 1
    if k == 1:
        return None
    fn = "triu" if tri.side == "upper" else "tril"
    right = 1 if tri.side == "upper" else 0
    wrote = f"torch.{fn}(…, diagonal={tri.diagonal}) instead of diagonal={right}"
    if k > 1:
        ahead = "the next position" if k == 2 else f"the next {k - 1} positions"
        return f"it is off by one: {wrote}, so each position also sees {ahead}"
    return (f"it is off by one: {wrote} also masks each token itself, so row 0 has no key left (softmax of "
            "all −inf gives NaN)")


def fix_for(tri: Triangle, reading: str) -> str:
    """The mask that is right under ``reading``."""
    if reading == TRUE_ATTENDS:
        return "torch.ones(T, T, dtype=torch.bool).tril() (True = attend)"
    if tri.encoding == "bool":
        return ("torch.ones(T, T, dtype=torch.bool).triu(diagonal=1) (True = blocked), or "
                "torch.nn.Transformer.generate_square_subsequent_mask(T)")
    return "torch.nn.Transformer.generate_square_subsequent_mask(T) (−inf above the diagonal, 0 elsewhere)"


def float01_fix(one_means: Optional[str], bool_reading: Optional[str]) -> str:
    """How to turn a float 0/1 mask into one torch honours, given what its 1s mean (``None``: unknown)
    and the layer's bool convention (``None``: unknown)."""
    if one_means is None:
        blocked, attend = "<blocked>", "<attend>"
        legend = (" (<blocked> = mask == 0 if 1 marks tokens to keep, as Hugging Face's attention_mask does; "
                  "mask == 1 if 1 marks padding; <attend> is its negation)")
    else:
        blocked, attend = ("mask == 0", "mask == 1") if one_means == "attend" else ("mask == 1", "mask == 0")
        legend = ""
    if bool_reading == TRUE_ATTENDS:
        as_bool = f"a bool mask read as True = attend: {attend}"
    elif bool_reading == TRUE_BLOCKS:
        as_bool = f"a bool mask read as True = blocked: {blocked}"
    else:
        as_bool = (f"a bool mask: {blocked} for nn.MultiheadAttention and the transformer layers (True = blocked), "
                   f"{attend} for F.scaled_dot_product_attention (True = attend)")
    return (f"Pass {as_bool}; or a 0/−inf mask: torch.zeros_like(mask).masked_fill({blocked}, float('-inf'))"
            + legend)

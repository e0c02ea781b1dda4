"""The torch callables that trigger the op rules: groups of ops that fail for the same reasons.

A rule of :mod:`layerlab.engine.rule_registry` says which ops it explains with the callables
themselves (``torch.cat``, ``torch.Tensor.view``, ``F.scaled_dot_product_attention``), never with
name strings: a renamed or aliased op cannot then slip past a spelling. The op trace calls an op
by the name of the callable torch dispatched (``torch.add`` and ``torch.Tensor.add`` are both
``add``), so a rule triggered by one spelling answers for its aliases too
(:func:`layerlab.engine.rule_registry.rules_for`).
"""

from __future__ import annotations

from typing import Any, Tuple

import torch
import torch.nn.functional as F
import torch.nn.utils.rnn as rnn_utils

T = torch.Tensor


def matches(func: Any, group: Tuple[Any, ...]) -> bool:
    """Whether the op ``func`` (a failed op's callable) is one of ``group``, or an alias the op trace
    calls by the same name (``torch.add`` for ``torch.Tensor.add``)."""
    from layerlab.probe.ops import op_name

    name = op_name(func)
    return any(c is func or op_name(c) == name for c in group)


def _present(*callables: Any) -> Tuple[Any, ...]:
    """The callables this torch has (``torch.concatenate`` is newer than some releases)."""
    return tuple(c for c in callables if c is not None)


#: ``x.view(…)``, ``x.reshape(…)``, ``torch.reshape``, ``x.view_as(y)``
VIEWS = _present(T.view, T.reshape, torch.reshape, T.view_as)
#: ``torch.cat`` and its aliases
JOINS = _present(torch.cat, getattr(torch, "concat", None), getattr(torch, "concatenate", None))
STACK = (torch.stack,)
MASKED_FILL = (T.masked_fill, T.masked_fill_, torch.masked_fill)
SDPA = (F.scaled_dot_product_attention,)
EINSUM = (torch.einsum,)
GRID_SAMPLE = (F.grid_sample,)
PACK = _present(rnn_utils.pack_padded_sequence, getattr(torch, "_pack_padded_sequence", None))
#: losses whose target holds class indices
CLASS_LOSSES = (F.cross_entropy, F.nll_loss)
BCE_LOSSES = (F.binary_cross_entropy_with_logits, F.binary_cross_entropy)
#: ops whose operands multiply as matrices (``F.linear``: x · weightᵀ)
MATMUL = (torch.matmul, T.matmul, T.__matmul__, T.__rmatmul__, torch.mm, T.mm, torch.bmm, T.bmm,
          torch.baddbmm, T.baddbmm, torch.addmm, T.addmm, F.linear)
#: ops that index one tensor with another
INDEX = (torch.gather, T.gather, torch.index_select, T.index_select, T.__getitem__, torch.take_along_dim,
         T.take_along_dim, F.embedding, torch.index_add, T.index_add, torch.scatter, T.scatter, T.scatter_,
         torch.scatter_add, T.scatter_add, T.index_put_)

_ELEMENTWISE = ("add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder", "pow", "where", "maximum",
                "minimum", "eq", "ne", "lt", "le", "gt", "ge", "rsub", "atan2", "hypot", "logical_and",
                "logical_or", "bitwise_and", "bitwise_or")


def _elementwise() -> Tuple[Any, ...]:
    """``torch.add``, ``x.add``, ``x + y`` (``__add__``) … for the binary elementwise ops, which broadcast
    their operands: each op's function, method and operator objects, looked up on torch (the names
    here are attribute names, never matched against the trace)."""
    found = []
    for name in _ELEMENTWISE:
        for c in (getattr(torch, name, None), getattr(T, name, None), getattr(T, f"__{name}__", None)):
            if c is not None and c not in found:
                found.append(c)
    return tuple(found) + (T.add_, T.sub_, T.mul_, T.div_, T.__radd__, T.__rsub__, T.__rmul__, T.__truediv__,
                           T.__rtruediv__, T.__iadd__, T.__isub__, T.__imul__, T.__itruediv__, T.expand_as, T.copy_,
                           T.masked_fill_)


#: binary elementwise ops: their operands broadcast (sizes equal or 1, aligned from the right)
BROADCAST = _elementwise()

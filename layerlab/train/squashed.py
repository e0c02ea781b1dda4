"""A softmax or sigmoid in front of a loss that applies one itself (``cross_entropy``, ``BCEWithLogitsLoss``).

``F.cross_entropy`` takes raw scores (logits) and applies ``log_softmax`` itself; fed
probabilities, it squashes them a second time: the scores can only span [0, 1], the loss has a
floor well above 0 (for C classes, at best ``log(1 + (C - 1) / e)``) and the gradients shrink — the
loss falls a little and stalls, the classic "my loss won't go down". ``BCEWithLogitsLoss`` likewise
applies the sigmoid itself. What is seen is certain, not guessed: the autograd node that made the
prediction (``SoftmaxBackward0``, ``SigmoidBackward0``), looked for through ops that only move or
reshape values (a ``squeeze``, a ``view``). ``log_softmax`` (for ``nll``) and a sigmoid before
``BCELoss`` are what those losses want, and are not flagged.

A loss given as your own function (``lambda p, t: F.cross_entropy(p, t, label_smoothing=0.1)``) is
read the same way, in the first step's loss graph: a ``log_softmax`` (what ``cross_entropy`` computes
first) or a ``binary_cross_entropy_with_logits`` node whose input is the squashing node itself.
"""

from __future__ import annotations

from typing import Dict, Any, List, Optional, Tuple

import torch
import torch.nn.functional as F

from layerlab.errors import Problem

__all__ = ["findings"]

#: autograd nodes that only move or reshape values: the squashing op may sit just before them
_SHAPE_ONLY = ("ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0", "SqueezeBackward0",
               "SqueezeBackward1", "SqueezeBackward2", "UnsqueezeBackward0", "TBackward0", "TransposeBackward0",
               "PermuteBackward0", "SelectBackward0", "SliceBackward0", "CloneBackward0", "ExpandBackward0",
               "CatBackward0", "StackBackward0", "FlattenBackward0")
_SQUASH = {"SoftmaxBackward0": "softmax", "SigmoidBackward0": "sigmoid"}
#: the loss-graph node that applies each activation itself (cross_entropy starts with log_softmax)
_APPLIES = {"LogSoftmaxBackward0": "softmax", "BinaryCrossEntropyWithLogitsBackward0": "sigmoid"}
_GRAPH_NODES = 200  # a loss's own graph is small: how far to look for the node above


def _logits_loss(name: str, fn: Any) -> Optional[str]:
    """Which activation the loss applies itself, or None."""
    if name == "cross_entropy" or fn is F.cross_entropy or isinstance(fn, torch.nn.CrossEntropyLoss):
        return "softmax"
    if fn is F.binary_cross_entropy_with_logits or isinstance(fn, torch.nn.BCEWithLogitsLoss):
        return "sigmoid"
    return None


def _applied_in_graph(value: Any, squash_node: Any) -> Optional[str]:
    """Which activation a loss function applies to ``squash_node``'s output, read in the loss graph."""
    if squash_node is None or not isinstance(value, torch.Tensor) or value.grad_fn is None:
        return None
    todo, seen = [value.grad_fn], set()
    while todo and len(seen) < _GRAPH_NODES:
        node = todo.pop()
        if node is None or node in seen or node is squash_node:
            continue
        seen.add(node)
        kind = _APPLIES.get(type(node).__name__)
        if kind is not None and node.next_functions:
            first = node.next_functions[0][0]
            if maker_node(first) is squash_node:
                return kind
        todo.extend(n for n, _ in node.next_functions)
    return None


def maker_node(node: Any) -> Any:
    """The first node at or below ``node`` that is not a shape-only op (at most 8 of them)."""
    hops = 0
    while node is not None and hops < 8 and type(node).__name__ in _SHAPE_ONLY:
        node = node.next_functions[0][0] if node.next_functions else None
        hops += 1
    return node


def maker(pred: torch.Tensor, wanted: Dict[str, Any]) -> Tuple[Any, Any]:
    """``(wanted[kind], its autograd node)`` of the op that made ``pred``, looking through ops that only
    move values (``_SHAPE_ONLY``, at most 8 of them); ``(None, None)`` when another op made it."""
    node, hops = pred.grad_fn, 0
    while node is not None and hops < 8:
        kind = type(node).__name__
        if kind in wanted:
            return wanted[kind], node
        if kind not in _SHAPE_ONLY:
            return None, None
        node = node.next_functions[0][0] if node.next_functions else None
        hops += 1
    return None, None


def _last_op(pred: torch.Tensor) -> Tuple[Optional[str], Any]:
    """``(softmax | sigmoid | None, its autograd node)`` of the op that made ``pred``."""
    return maker(pred, _SQUASH)


def findings(objective: Any, pred: torch.Tensor, made_by: List[Tuple[Any, str]],
             value: Any = None) -> Optional[Problem]:
    """An error when the prediction was squashed by the activation the loss applies itself.
    ``made_by``: (autograd node, the module whose output it made) pairs (an ``nn.Softmax`` is named;
    ``F.softmax`` called in a forward is not a module, and the output the loss reads is named instead).
    ``value``: the first step's loss, read for a loss function layerlab does not know by name."""
    if not isinstance(pred, torch.Tensor):
        return None
    op, node = _last_op(pred)
    applies = _logits_loss(getattr(objective, "loss_name", ""), getattr(objective, "fn", None))
    if applies is None and op is not None:
        applies = _applied_in_graph(value, node)
    if applies is None or op != applies:
        return None
    module = next((path for made, path in made_by if made is node), None)
    loss = "cross_entropy" if applies == "softmax" else "BCEWithLogitsLoss"
    fix = ("drop the softmax and give cross_entropy the raw scores (keep softmax for predictions only), or "
           "end with log_softmax and use nll" if applies == "softmax" else
           "drop the sigmoid and give BCEWithLogitsLoss the raw scores, or keep it and use BCELoss")
    return Problem("double-" + applies, f"the prediction the loss reads ({objective.output_path}) comes out of a {applies}, and "
                   f"{loss} applies a {applies} itself: the scores are squashed twice, so the loss has a floor "
                   "above 0 and small gradients — it falls a little and stalls" +
                   (f" ({applies} at module {module or '(root)'})" if module is not None else ""),
                   where=objective.output_path if module is None else module or "(root)",
                   severity="error", hint=fix)

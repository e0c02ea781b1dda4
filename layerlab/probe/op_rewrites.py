"""Named ways to call one op of the user's code differently: the ``rewrite`` of a ``replace-op`` fix.

:mod:`layerlab.probe.fixes` applies a ``replace-op`` fix through the op trace's substitutions: at
the op's source line, ``(func, args, kwargs)`` is changed before the call. The older rewrites
(another ``dim``, ``reshape`` for ``view``, a converted operand) are read from the fix's params
directly; the ones here are picked by name (``params["rewrite"]``), so that a new kind of change
does not grow that function:

* ``equation``: ``torch.einsum`` with another equation (a mislabeled subscript), operands kept;
* ``shape``: ``x.reshape(…)`` / ``x.view(…)`` with other sizes (``reshape(B, -1, K)``, not ``A``);
* ``flatten-item``: one tensor of a ``torch.cat`` list flattened from dim 1 (a 4-D feature map
  joined with 2-D features).
"""

from __future__ import annotations

from typing import Any, Callable, Dict

import torch


def _equation(params: Dict[str, Any]) -> Callable:
    eq = params["equation"]

    def rewrite(func, args, kwargs):
        return func, (eq, *args[1:]), kwargs
    return rewrite


def _shape(params: Dict[str, Any]) -> Callable:
    shape = [int(s) for s in params["shape"]]

    def rewrite(func, args, kwargs):
        return torch.Tensor.reshape, (args[0], *shape), {}
    return rewrite


def _flatten_item(params: Dict[str, Any]) -> Callable:
    which = params["item"]

    def rewrite(func, args, kwargs):
        items = list(args[0])
        items[which] = items[which].flatten(1)
        return func, (items, *args[1:]), kwargs
    return rewrite


REWRITES = {"equation": _equation, "shape": _shape, "flatten-item": _flatten_item}


def substitution(params: Dict[str, Any]) -> Callable:
    """The ``(func, args, kwargs) -> (func, args, kwargs)`` change named by ``params["rewrite"]``."""
    return REWRITES[params["rewrite"]](params)

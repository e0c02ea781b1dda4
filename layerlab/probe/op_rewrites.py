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

The fix search's edit grammar (:mod:`layerlab.engine.fix_search`) adds:

* ``move-index``: an indexing ``x[…]`` whose entry for axis ``from`` acts on axis ``to`` instead
  (a causal chomp ``x[:, :-k]`` that cut the channels where the time was meant);
* ``swap``: the two operands of a matmul swapped;
* ``drop``: the op left out (its first operand passed on: a ``transpose`` that should not be);
* ``keepdim``: a reduction with ``keepdim=True``;
* ``gather-index``: the index of ``gather``/``scatter`` given the input's rank (``unsqueeze(-1)`` and
  ``expand`` over the axes it lacks);
* ``repeat``: operands ``args`` repeated ``repeats`` times on ``dim`` (``repeat_interleave``: the
  key/value heads of grouped-query attention);
* ``fit``: operand ``arg`` (or item ``item`` of a list operand) interpolated, cropped or padded to
  the trailing ``size`` (a skip connection off by a few pixels);
* ``convert``: operand ``arg`` converted (``to``, as a ``cast-input`` fix: ``long``, ``bool``, ``insert:…``).
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


def _index_entries(index, rank: int) -> list:
    """An index as one entry per axis (``...`` expanded, missing trailing axes as ``:``)."""
    entries = list(index) if isinstance(index, tuple) else [index]
    if any(e is Ellipsis for e in entries):
        at = next(i for i, e in enumerate(entries) if e is Ellipsis)
        fill = rank - (len(entries) - 1)
        entries = entries[:at] + [slice(None)] * fill + entries[at + 1:]
    return entries + [slice(None)] * (rank - len(entries))


def _move_index(params: Dict[str, Any]) -> Callable:
    src, dst = params["from"], params["to"]

    def rewrite(func, args, kwargs):
        entries = _index_entries(args[1], args[0].dim())
        entries[src], entries[dst] = entries[dst], entries[src]
        return func, (args[0], tuple(entries)), kwargs
    return rewrite


def _swap(params: Dict[str, Any]) -> Callable:
    def rewrite(func, args, kwargs):
        return func, (args[1], args[0], *args[2:]), kwargs
    return rewrite


def _passed_on(x):
    return x


def _drop(params: Dict[str, Any]) -> Callable:
    def rewrite(func, args, kwargs):
        return _passed_on, (args[0],), {}
    return rewrite


def _keepdim(params: Dict[str, Any]) -> Callable:
    def rewrite(func, args, kwargs):
        return func, args, {**kwargs, "keepdim": True}
    return rewrite


def _gather_index(params: Dict[str, Any]) -> Callable:
    at = params.get("index", 2)

    def rewrite(func, args, kwargs):
        args = list(args)
        source, index = args[0], (args[at] if at < len(args) else kwargs["index"])
        dim = args[1] if len(args) > 1 and isinstance(args[1], int) else kwargs.get("dim", 0)
        dim = dim % source.dim()
        while index.dim() < source.dim():
            index = index.unsqueeze(-1)
        sizes = [source.shape[d] if index.shape[d] == 1 and d != dim else -1 for d in range(source.dim())]
        index = index.expand(*sizes)
        if at < len(args):
            args[at] = index
            return func, tuple(args), kwargs
        return func, tuple(args), {**kwargs, "index": index}
    return rewrite


def _repeat(params: Dict[str, Any]) -> Callable:
    which, repeats, dim = params["args"], params["repeats"], params["dim"]

    def rewrite(func, args, kwargs):
        args = list(args)
        for i in which:
            args[i] = args[i].repeat_interleave(repeats, dim=dim)
        return func, tuple(args), kwargs
    return rewrite


def fit(x: torch.Tensor, size, how: str) -> torch.Tensor:
    """``x`` brought to the trailing spatial ``size``: ``interpolate``, ``crop`` (top-left) or ``pad`` (zeros)."""
    size = [int(s) for s in size]
    if how == "interpolate":
        mode = {1: "linear", 2: "bilinear", 3: "trilinear"}[len(size)]
        return torch.nn.functional.interpolate(x, size=size, mode=mode, align_corners=False)
    for k, want in enumerate(size):
        axis = x.dim() - len(size) + k
        if how == "crop":
            x = x.narrow(axis, 0, min(want, x.shape[axis]))
        else:
            pad = [0, 0] * (x.dim() - axis - 1) + [0, max(0, want - x.shape[axis])]
            x = torch.nn.functional.pad(x, pad)
    return x


def _fit(params: Dict[str, Any]) -> Callable:
    size, how = params["size"], params["how"]

    def rewrite(func, args, kwargs):
        args = list(args)
        if "item" in params:
            items = list(args[0])
            items[params["item"]] = fit(items[params["item"]], size, how)
            args[0] = items
        else:
            args[params["arg"]] = fit(args[params["arg"]], size, how)
        return func, tuple(args), kwargs
    return rewrite


def _convert_operand(params: Dict[str, Any]) -> Callable:
    from layerlab.probe.fixes import convert

    which, to = params["arg"], params["to"]

    def rewrite(func, args, kwargs):
        if isinstance(which, int):
            args = (*args[:which], convert(args[which], to), *args[which + 1:])
        else:
            kwargs = {**kwargs, which: convert(kwargs[which], to)}
        return func, args, kwargs
    return rewrite


REWRITES = {"equation": _equation, "shape": _shape, "flatten-item": _flatten_item, "move-index": _move_index,
            "swap": _swap, "drop": _drop, "keepdim": _keepdim, "gather-index": _gather_index, "repeat": _repeat,
            "fit": _fit, "convert": _convert_operand}


def substitution(params: Dict[str, Any]) -> Callable:
    """The ``(func, args, kwargs) -> (func, args, kwargs)`` change named by ``params["rewrite"]``."""
    return REWRITES[params["rewrite"]](params)

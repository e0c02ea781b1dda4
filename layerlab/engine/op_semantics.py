"""The table of op semantics: how each torch callable moves, merges, splits, reduces or makes axes.

One registry, keyed by the torch callables themselves (``torch.Tensor.transpose``,
``torch.nn.functional.linear``, ``torch.cat``), never by name strings, filled by the
:func:`semantics` decorator, which refuses a callable registered twice (the pattern of
``torch/utils/flop_counter.py``). A rule gets an :class:`~layerlab.engine.provenance.OpContext`
(the call's arguments, its operands' labels, its outputs) and returns the labels of each output
tensor; it may record *events* (``ctx.event``) that the silent-bug findings read: a reduction
over an axis, a constant index, an axis bound to a parameter's size, a view's groups, two
operands' axes that broadcasting or a contraction paired.

An op that is not in the table gives unknown labels (never a guess). Elementwise ops are taken
from torch's own ``pointwise`` tag on the aten ops, so ``index_add_`` next to ``index_add`` or a
new activation cannot be missed by a spelling.

Kinds (``ctx.kind``): ``elementwise``, ``identity``, ``move``, ``view``, ``squeeze``, ``index``,
``reduce``, ``normalize``, ``join``, ``split``, ``matmul``, ``contract`` (a layer's functional
form: linear, conv, norm, embedding, RNN, attention), ``loss``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import torch
import torch.nn.functional as F

from layerlab.engine.labels import atoms_of, broadcast, regroup, resized

Rule = Callable[[Any], Any]

#: callable → (kind, rule)
TABLE: Dict[Any, Tuple[str, Rule]] = {}


def semantics(kind: str, *callables: Any):
    """Register ``rule`` for every callable given (missing ones, e.g. on an older torch, are
    skipped); a callable registered twice is a bug of the table and raises."""
    def register(rule: Rule) -> Rule:
        for c in callables:
            if c is None:
                continue
            if c in TABLE:
                raise ValueError(f"op semantics registered twice for {c!r}")
            TABLE[c] = (kind, rule)
        return rule
    return register


def _both(name: str):
    """``torch.<name>`` and ``torch.Tensor.<name>`` (and the in-place ``<name>_`` method) where they exist."""
    found = [getattr(torch, name, None), getattr(torch.Tensor, name, None), getattr(torch.Tensor, name + "_", None)]
    seen, out = set(), []
    for f in found:
        if f is not None and id(f) not in seen:
            seen.add(id(f)); out.append(f)
    return out


def _dim(d: int, n: int) -> int:
    return d + n if d < 0 else d


# -- elementwise ---------------------------------------------------------------------------------
def _pointwise_callables():
    names = set()
    for name in dir(torch.ops.aten):
        try:
            packet = getattr(torch.ops.aten, name)
            overloads = packet.overloads()
        except Exception:
            continue
        for o in overloads:
            if torch.Tag.pointwise in getattr(packet, o).tags:
                names.add(name.rstrip("_"))
                break
    names -= {"max", "min", "clone", "where", "masked_fill"}  # registered with their own rules below
    out = []
    for name in sorted(names):
        out += _both(name)
    dunders = ["add", "radd", "iadd", "sub", "rsub", "isub", "mul", "rmul", "imul", "truediv", "rtruediv",
               "itruediv", "floordiv", "rfloordiv", "ifloordiv", "mod", "rmod", "pow", "rpow", "ipow", "neg", "abs",
               "and", "rand", "iand", "or", "ror", "ior", "xor", "rxor", "ixor", "invert", "eq", "ne", "lt", "le",
               "gt", "ge", "lshift", "rshift", "div", "idiv"]
    out += [getattr(torch.Tensor, f"__{d}__") for d in dunders if hasattr(torch.Tensor, f"__{d}__")]
    funcs = [F.relu, F.relu6, F.gelu, F.silu, F.mish, F.elu, F.selu, F.celu, F.leaky_relu, F.hardtanh, F.hardswish,
             F.hardsigmoid, F.softplus, F.softsign, F.tanhshrink, F.softshrink, F.hardshrink, F.logsigmoid,
             F.sigmoid, F.tanh, F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout,
             F.feature_alpha_dropout, F.threshold, F.prelu, F.rrelu,
             torch.where, torch.Tensor.where, torch.masked_fill, torch.Tensor.masked_fill,
             torch.Tensor.masked_fill_, torch.lerp, torch.Tensor.lerp, torch.clamp, torch.Tensor.clamp,
             torch.Tensor.clamp_, torch.Tensor.clip, torch.Tensor.masked_scatter]
    seen, unique = set(), []
    for f in out + funcs:
        if f is not None and f not in seen:
            seen.add(f); unique.append(f)
    return unique


@semantics("elementwise", *_pointwise_callables())
def _elementwise(ctx):
    if not ctx.outs:
        return None
    labels, meets = broadcast(ctx.in_labels, ctx.in_shapes, ctx.out_shapes[0])
    if meets:
        ctx.event("broadcast", meets=meets)
    return [labels] * len(ctx.outs)


@semantics("identity", *(getattr(torch.Tensor, n) for n in (
    "contiguous", "clone", "detach", "float", "double", "half", "bfloat16", "long", "int", "short", "bool", "byte",
    "char", "to", "type", "type_as", "cpu", "cuda", "requires_grad_", "detach_", "coalesce", "pin_memory")
    if hasattr(torch.Tensor, n)), torch.clone, torch.detach, torch.zeros_like, torch.ones_like, torch.empty_like,
    torch.rand_like, torch.randn_like, torch.full_like, torch.randint_like, torch.tril, torch.Tensor.tril,
    torch.triu, torch.Tensor.triu, torch.Tensor.tril_, torch.Tensor.triu_, torch.flip, torch.Tensor.flip,
    torch.roll, torch.Tensor.roll, torch.Tensor.fill_, torch.Tensor.zero_, torch.Tensor.copy_,
    torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.bernoulli_, torch.bernoulli)
def _identity(ctx):
    first = ctx.in_labels[0] if ctx.in_labels else None
    return [first] * len(ctx.outs)


# -- axis moves ----------------------------------------------------------------------------------
@semantics("move", torch.transpose, torch.Tensor.transpose, torch.swapaxes, torch.Tensor.swapaxes,
           torch.swapdims, torch.Tensor.swapdims, torch.Tensor.transpose_)
def _transpose(ctx):
    lab = list(ctx.in_labels[0])
    n = len(lab)
    a, b = _dim(ctx.int_arg(1, "dim0"), n), _dim(ctx.int_arg(2, "dim1"), n)
    lab[a], lab[b] = lab[b], lab[a]
    return [tuple(lab)]


@semantics("move", torch.t, torch.Tensor.t, torch.Tensor.t_)
def _t(ctx):
    return [tuple(reversed(ctx.in_labels[0]))]


@semantics("move", torch.permute, torch.Tensor.permute)
def _permute(ctx):
    dims = ctx.int_list(1, "dims")
    lab = ctx.in_labels[0]
    return [tuple(lab[_dim(d, len(lab))] for d in dims)]


@semantics("move", torch.movedim, torch.Tensor.movedim, torch.moveaxis, torch.Tensor.moveaxis)
def _movedim(ctx):
    lab = list(ctx.in_labels[0])
    n = len(lab)
    src, dst = ctx.arg(1, "source"), ctx.arg(2, "destination")
    src = [src] if isinstance(src, int) else list(src)
    dst = [dst] if isinstance(dst, int) else list(dst)
    src, dst = [_dim(s, n) for s in src], [_dim(d, n) for d in dst]
    out = [None] * n
    for s, d in zip(src, dst):
        out[d] = lab[s]
    rest = iter(lab[k] for k in range(n) if k not in src)
    return [tuple(out[k] if k in dst else next(rest) for k in range(n))]


# -- views ---------------------------------------------------------------------------------------
@semantics("view", torch.reshape, torch.Tensor.reshape, torch.Tensor.view, torch.Tensor.view_as,
           torch.Tensor.reshape_as, torch.flatten, torch.Tensor.flatten, torch.unflatten, torch.Tensor.unflatten,
           torch.Tensor.expand, torch.Tensor.expand_as, torch.broadcast_to, torch.Tensor.broadcast_to)
def _view(ctx):
    src = ctx.in_shapes[0]
    out = ctx.out_shapes[0]
    lab = ctx.in_labels[0]
    if ctx.func in (torch.Tensor.expand, torch.Tensor.expand_as, torch.broadcast_to, torch.Tensor.broadcast_to):
        labels, _ = broadcast([lab], [src], out)
        return [labels]
    import math
    if math.prod(src) != math.prod(out):
        return None
    labels, groups = regroup(lab, src, out, ctx.piece, ctx.join)
    ctx.event("view", groups=groups)
    labels = tuple(lab_ if s != 1 or lab_ is not None else ctx.inserted() for lab_, s in zip(labels, out))
    return [labels]


@semantics("squeeze", torch.squeeze, torch.Tensor.squeeze, torch.Tensor.squeeze_)
def _squeeze(ctx):
    lab, shape = ctx.in_labels[0], ctx.in_shapes[0]
    dim = ctx.arg(1, "dim")
    n = len(shape)
    if dim is None:
        dims = {k for k, s in enumerate(shape) if s == 1}
    else:
        dims = {_dim(d, n) for d in ([dim] if isinstance(dim, int) else dim) if shape[_dim(d, n)] == 1}
    return [tuple(label for k, label in enumerate(lab) if k not in dims)]


@semantics("squeeze", torch.unsqueeze, torch.Tensor.unsqueeze, torch.Tensor.unsqueeze_)
def _unsqueeze(ctx):
    lab = list(ctx.in_labels[0])
    d = ctx.int_arg(1, "dim")
    d = d + len(lab) + 1 if d < 0 else d
    lab.insert(d, ctx.inserted())
    return [tuple(lab)]


@semantics("index", torch.Tensor.__getitem__)
def _getitem(ctx):
    lab, out = ctx.in_labels[0], ctx.out_shapes[0]
    index = ctx.args[1]
    index = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index):
        return None  # a mask: how many elements it keeps depends on values
    n_real = sum(1 for i in index if i is not None and i is not Ellipsis and not isinstance(i, bool))
    result, k, tensor_seen = [], 0, False
    for i in index:
        if i is Ellipsis:
            skip = len(lab) - n_real
            result.extend(lab[k:k + skip]); k += skip
        elif i is None:
            result.append(ctx.inserted())
        elif isinstance(i, int) and not isinstance(i, bool):
            ctx.event("const-index", axis=k, label=lab[k], value=i)
            k += 1
        elif isinstance(i, slice):
            result.append(lab[k] if (i.start, i.stop, i.step) == (None, None, None) else resized(lab[k], -1)); k += 1
        elif isinstance(i, torch.Tensor):
            if not tensor_seen:
                result.extend(ctx.labels_of(i) if i.dim() else ())
                tensor_seen = True
            k += 1
        else:
            return None
    result.extend(lab[k:])
    if len(result) != len(out):
        return None
    return [tuple(r if r is None or len(r) != 1 or r[0][1] != -1 else resized(r, s) for r, s in zip(result, out))]


@semantics("index", torch.select, torch.Tensor.select)
def _select(ctx):
    lab = ctx.in_labels[0]
    d = _dim(ctx.int_arg(1, "dim"), len(lab))
    ctx.event("const-index", axis=d, label=lab[d], value=ctx.arg(2, "index"))
    return [lab[:d] + lab[d + 1:]]


@semantics("index", torch.narrow, torch.Tensor.narrow)
def _narrow(ctx):
    lab = list(ctx.in_labels[0])
    d = _dim(ctx.int_arg(1, "dim"), len(lab))
    lab[d] = resized(lab[d], ctx.out_shapes[0][d])
    return [tuple(lab)]


@semantics("index", torch.index_select, torch.Tensor.index_select)
def _index_select(ctx):
    lab = list(ctx.in_labels[0])
    d = _dim(ctx.int_arg(1, "dim"), len(lab))
    idx = ctx.labels_of(ctx.arg(2, "index"))
    lab[d] = idx[0] if idx else None
    return [tuple(lab)]


@semantics("index", torch.gather, torch.Tensor.gather, torch.take_along_dim, torch.Tensor.take_along_dim)
def _gather(ctx):
    idx = ctx.arg(2, "index") if ctx.func in (torch.gather, torch.Tensor.gather) else ctx.arg(1, "indices")
    return [ctx.labels_of(idx)]


# -- reductions and normalisations ---------------------------------------------------------------
def _reduced_dims(ctx, n):
    dim = ctx.arg(1, "dim")
    if dim is None:
        return list(range(n))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return [_dim(d, n) for d in dims]


@semantics("reduce", *_both("sum"), *_both("mean"), *_both("amax"), *_both("amin"), *_both("prod"),
           *_both("std"), *_both("var"), *_both("logsumexp"), *_both("nansum"), *_both("nanmean"),
           *_both("argmax"), *_both("argmin"), *_both("all"), *_both("any"), *_both("max"), *_both("min"),
           *_both("median"), *_both("norm"), *_both("count_nonzero"))
def _reduce(ctx):
    lab = ctx.in_labels[0]
    n = len(lab)
    if len(ctx.in_labels) > 1:  # torch.max(a, b): elementwise
        labels, _ = broadcast(ctx.in_labels, ctx.in_shapes, ctx.out_shapes[0])
        return [labels] * len(ctx.outs)
    dims = _reduced_dims(ctx, n)
    if not dims or (ctx.arg(1, "dim") is None and ctx.out_shapes[0] == []):
        ctx.event("reduce", axes=list(range(n)), labels=list(lab), keepdim=False)
        return [()] * len(ctx.outs)
    keep = len(ctx.out_shapes[0]) == n  # keepdim's place differs between overloads: the rank says
    ctx.event("reduce", axes=dims, labels=[lab[d] for d in dims], keepdim=keep)
    out = tuple((ctx.inserted() if keep else "drop") if k in dims else lab[k] for k in range(n))
    out = tuple(x for x in out if x != "drop")
    return [out] * len(ctx.outs)


@semantics("normalize", torch.softmax, torch.Tensor.softmax, F.softmax, torch.log_softmax, torch.Tensor.log_softmax,
           F.log_softmax, F.softmin, F.normalize, torch.cumsum, torch.Tensor.cumsum, torch.cumprod,
           torch.Tensor.cumprod, torch.logcumsumexp, torch.Tensor.logcumsumexp, F.gumbel_softmax)
def _normalize(ctx):
    lab = ctx.in_labels[0]
    dim = ctx.arg(1, "dim")
    if ctx.func is F.normalize:
        dim = ctx.arg(2, "dim", 1)
    if ctx.func is F.gumbel_softmax:
        dim = ctx.kwargs.get("dim", -1)
    if isinstance(dim, int) and lab:
        d = _dim(dim, len(lab))
        ctx.event("normalize", axes=[d], labels=[lab[d]])
    return [lab]


@semantics("join", torch.cat, torch.concat, torch.concatenate)
def _cat(ctx):
    tensors = [t for t in ctx.args[0] if isinstance(t, torch.Tensor) and t.dim() > 0]
    if not tensors:
        return None
    labs = [ctx.labels_of(t) for t in tensors]
    n = len(labs[0])
    d = _dim(ctx.arg(1, "dim", 0), n)
    out = list(labs[0])
    atoms = {atoms_of(lab[d]) for lab in labs}
    out[d] = resized(labs[0][d], ctx.out_shapes[0][d]) if len(atoms) == 1 else ctx.new("cat", ctx.out_shapes[0][d])
    shapes = [list(t.shape) for t in tensors]
    others = [k for k in range(n) if k != d]
    _, meets = broadcast([tuple(lab[k] for k in others) for lab in labs], [[s[k] for k in others] for s in shapes],
                         [ctx.out_shapes[0][k] for k in others])
    if meets:
        ctx.event("broadcast", meets=[(others[k], c) for k, c in meets])
    return [tuple(out)]


@semantics("join", torch.stack)
def _stack(ctx):
    tensors = [t for t in ctx.args[0] if isinstance(t, torch.Tensor)]
    if not tensors:
        return None
    lab = list(ctx.labels_of(tensors[0]))
    d = ctx.arg(1, "dim", 0)
    d = d + len(lab) + 1 if d < 0 else d
    lab.insert(d, ctx.new("stack", len(tensors)))
    return [tuple(lab)]


@semantics("split", torch.split, torch.Tensor.split, torch.chunk, torch.Tensor.chunk, torch.tensor_split,
           torch.Tensor.tensor_split, torch.Tensor.split_with_sizes)
def _split(ctx):
    lab = ctx.in_labels[0]
    d = _dim(ctx.arg(2, "dim", 0), len(lab))
    return [tuple(resized(x, s[d]) if k == d else x for k, x in enumerate(lab)) for s in ctx.out_shapes]


@semantics("split", torch.unbind, torch.Tensor.unbind)
def _unbind(ctx):
    lab = ctx.in_labels[0]
    d = _dim(ctx.arg(1, "dim", 0), len(lab))
    return [lab[:d] + lab[d + 1:]] * len(ctx.outs)


# -- matrix products -----------------------------------------------------------------------------
@semantics("matmul", torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__,
           torch.mm, torch.Tensor.mm, torch.bmm, torch.Tensor.bmm)
def _matmul(ctx):
    a, b = ctx.in_labels[0], ctx.in_labels[1]
    sa, sb = ctx.in_shapes[0], ctx.in_shapes[1]
    if ctx.func is torch.Tensor.__rmatmul__:
        a, b, sa, sb = b, a, sb, sa
    if len(sa) < 1 or len(sb) < 1:
        return None
    ctx.event("contract", pairs=[(a[-1], sa[-1], b[-2] if len(sb) > 1 else b[0], sb[-2] if len(sb) > 1 else sb[0])])
    if len(sa) == 1 or len(sb) == 1:
        rest = a[:-1] if len(sb) == 1 else b[:-2] + b[-1:]
        return [tuple(rest)]
    batch, meets = broadcast([a[:-2], b[:-2]], [sa[:-2], sb[:-2]], ctx.out_shapes[0][:-2])
    if meets:
        ctx.event("broadcast", meets=meets)
    return [tuple(batch) + (a[-2], b[-1])]


@semantics("matmul", torch.einsum)
def _einsum(ctx):
    eq = ctx.args[0]
    ops = [t for t in (ctx.args[1:] if len(ctx.args) > 2 or not isinstance(ctx.args[1], (list, tuple))
                       else ctx.args[1]) if isinstance(t, torch.Tensor)]
    if not isinstance(eq, str) or "..." in eq or "->" not in eq:
        return None
    ins, out = eq.replace(" ", "").split("->")
    seen = {}
    pairs = []
    for spec, t in zip(ins.split(","), ops):
        lab = ctx.labels_of(t)
        for ch, label, size in zip(spec, lab, t.shape):
            if ch in seen and size > 1 and seen[ch][1] > 1:
                pairs.append((seen[ch][0], seen[ch][1], label, size))
            elif ch not in seen or seen[ch][1] == 1:
                seen[ch] = (label, size)
    if pairs:
        ctx.event("contract", pairs=pairs)
    return [tuple(seen[ch][0] if ch in seen else None for ch in out)]


@semantics("matmul", torch.addmm, torch.Tensor.addmm, torch.baddbmm, torch.Tensor.baddbmm)
def _addmm(ctx):
    """``addmm(bias, a, b)``: ``bias + a @ b`` (transformers' Conv1D, a Linear written by hand)."""
    a, b = ctx.in_labels[1], ctx.in_labels[2]
    sa, sb = ctx.in_shapes[1], ctx.in_shapes[2]
    ctx.event("contract", pairs=[(a[-1], sa[-1], b[-2], sb[-2])])
    lead = a[:-2] if len(sa) == 3 else ()
    return [tuple(lead) + (a[-2], b[-1])]


@semantics("view", torch.Tensor.repeat)
def _repeat(ctx):
    lab, out = ctx.in_labels[0], ctx.out_shapes[0]
    lead = (None,) * (len(out) - len(lab))
    return [lead + tuple(x if s == size else None for x, s, size in zip(lab, ctx.in_shapes[0], out[len(lead):]))]


# the layers' functional forms (linear, conv, norms, embedding, RNN, attention, losses): same table
from layerlab.engine import op_semantics_layers  # noqa: E402,F401

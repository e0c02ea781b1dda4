"""Fix search: candidate fixes from ONE small edit grammar, judged by the oracles, ranked by size.

Where a failing op or layer got an operand it did not expect, the mistake is often upstream: the
``squeeze()`` that ate the batch, the slice that cut the wrong axis, the reduction without
``keepdim``. Starting at the failure, :func:`sites` walks back through the op trace (the ops that
made each operand, a few steps) and :func:`candidates` proposes at each of them the edits of one
grammar:

* an axis move: ``permute``/``transpose`` of a layer's input, a ``transpose`` dropped or redone;
* matmul operands swapped; a reduction's ``dim`` or ``keepdim``; ``squeeze(d)`` for ``squeeze()``;
* ``reshape`` for ``view``; an indexing that acts on another axis (``x[:, :, :-k]``);
* ``repeat_interleave`` of the smaller operand (grouped-query attention); ``gather``/``scatter``
  index given the input's rank; ``unsqueeze`` for broadcasting;
* a layer's size argument; ``batch_first``; interpolate / crop / pad to the other operand's size;
* a dtype: ``long`` ids and indices, ``bool`` masks, ``.real`` of a complex tensor.

Every candidate is one :class:`~layerlab.probe.report.FixStep` that :mod:`layerlab.probe.fixes`
applies to a copy; :func:`search` keeps those that make the copy run, judges each with
:func:`layerlab.engine.oracles.judge` and ranks them: oracles passed, then every parameter's shape
kept (the layers as built are the author's intent), then fewest edits, then fewest parameters
changed (a rebuilt layer's weights count as changed). Upstream layer arguments that change no
parameter (a conv's ``padding``, a pool's ``ceil_mode`` …) come from
:mod:`layerlab.engine.upstream_args`. Two survivors that compute different outputs are two
readings, not one fix: :mod:`layerlab.engine.fix_meaning` tells them apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

import torch
from torch.nn.parameter import is_lazy

from layerlab.probe.context import op_site
from layerlab.probe.report import FixStep

#: How many ops back from each operand the search looks for the edit.
SITE_STEPS = 4
#: At most this many candidates are tried per failure.
MAX_CANDIDATES = 24

_REDUCTIONS = {"sum", "mean", "max", "min", "amax", "amin", "argmax", "argmin", "logsumexp", "std", "var",
               "prod", "norm", "nansum", "nanmean", "median"}
_DIM_OPS = _REDUCTIONS | {"softmax", "log_softmax", "F.softmax", "F.log_softmax", "cumsum", "F.normalize"}
_MOVES = {"transpose", "permute", "movedim", "swapaxes", "swapdims", "t"}
_MATMUL = {"matmul", "__matmul__", "bmm", "mm"}
_JOINS = {"cat", "concat", "stack", "add", "__add__", "sub", "__sub__", "mul", "__mul__", "__radd__", "__iadd__"}
_INDEXING = {"gather", "scatter", "scatter_add", "scatter_reduce", "take_along_dim"}
_SIZE_ARGS = ((torch.nn.Linear, "in_features", -1), (torch.nn.modules.conv._ConvNd, "in_channels", 1),
              (torch.nn.modules.batchnorm._BatchNorm, "num_features", 1), (torch.nn.RNNBase, "input_size", -1),
              (torch.nn.GroupNorm, "num_channels", 1))


@dataclass
class Candidate:
    """One edit: the fix, what it means (the fact about the data it assumes), and its size."""

    step: FixStep
    meaning: str
    params_changed: int = 0
    edits: int = 1
    distance: int = 0  # 0: at the failure; n: at the n-th op upstream of it
    decides: str = ""  # the fact about the data that tells this reading from another (empty: said by ``meaning``)
    keeps_layout: bool = False  # moves no axis and no data: only a layer's non-parameter argument (padding …)

    @property
    def keeps_shapes(self) -> bool:
        """No parameter is rebuilt: the layers as built are kept (the author's intent)."""
        return not self.params_changed


@dataclass
class Scored:
    """A candidate that made the copy run, with the oracles' verdict and the outputs' shapes."""

    candidate: Candidate
    verdict: Any
    outputs: List[List[int]] = field(default_factory=list)

    @property
    def rank(self) -> Tuple:
        c = self.candidate
        return (not self.verdict.ok, not c.keeps_shapes, c.edits, c.params_changed, c.distance)


def sites(ctx) -> List[Any]:
    """The op records near the failure: the failed op itself, then the ops that made its operands
    (or the failing layer's inputs), nearest first, ``SITE_STEPS`` deep."""
    from layerlab.probe.context import op_tensors

    failed = ctx.failed_op
    tensors = op_tensors(failed) if failed is not None else ctx.tensors()
    found, seen = ([failed.record] if failed is not None else []), set()
    frontier = [ctx.made_by(t)[0] for t in tensors]
    for _ in range(SITE_STEPS):
        nxt = []
        for index in frontier:
            record = ctx.op(index)
            if record is None or record.index in seen:
                continue
            seen.add(record.index)
            found.append(record)
            nxt += [i.from_op for i in record.inputs]
        frontier = nxt
    return found


def _site_step(record, code: str, **params) -> FixStep:
    return FixStep("replace-op", record.source or "", code, op_site(record, **params))


def _receiver(record) -> str:
    return record.receiver or (record.inputs[0].name if record.inputs else "x")


def _index_code(record, src: int, dst: int) -> Optional[str]:
    """``x[:, :, :-2]`` from ``x[:, :-2]`` with the entry of axis ``src`` moved to ``dst``."""
    found = re.search(r"([A-Za-z_][\w.]*)\[([^\[\]]*)\]", record.code or "")
    if not found:
        return None
    entries = [e.strip() for e in found.group(2).split(",")]
    if any(e == "..." for e in entries):
        return None
    entries += [":"] * (max(src, dst) + 1 - len(entries))
    entries[src], entries[dst] = entries[dst], entries[src]
    while entries and entries[-1] == ":":
        entries.pop()
    return f"{found.group(1)}[{', '.join(entries)}]"


def _matmul_operands(record) -> Tuple[str, str]:
    """The two operands of a matmul as written on its line (``bmm(x, t)``, ``x @ t``), for the message."""
    code, op = record.code or "", record.op.strip("_")
    found = re.search(rf"\b{op}\(\s*([\w.]+)\s*,\s*([\w.]+)\s*\)", code) if op != "matmul" or "@" not in code else None
    found = found or re.search(r"([\w.]+)\s*@\s*([\w.]+)", code)
    if found:
        return f"`{found.group(1)}`", f"`{found.group(2)}`"
    return "the first operand", "the second operand"


def op_candidates(record, batch: int = 0) -> List[Candidate]:
    """The grammar's edits of one recorded op (an upstream site, or the op that raised)."""
    if getattr(record, "line", None) is None or not record.inputs:
        return []
    out: List[Candidate] = []
    x = record.inputs[0].shape
    who = _receiver(record)
    op = record.op
    if op == "squeeze" and not any(k.isdigit() and k != "0" for k in record.args) and "dim" not in record.args:
        ones = [d for d in range(1, len(x)) if x[d] == 1]
        if ones:
            code = f"{who}.squeeze({ones[0] if len(ones) == 1 else tuple(ones)})"
            out.append(Candidate(_site_step(record, code, squeeze_dims=ones), "squeeze keeps the batch axis"))
        elif len(x) > 0 and x[0] == 1:
            out.append(Candidate(_site_step(record, f"{who} (without .squeeze())", rewrite="drop"),
                                 "the squeeze only ate the batch"))
    if op == "__getitem__" and record.outputs and len(record.outputs[0]) == len(x):
        cut = [d for d in range(len(x)) if x[d] != record.outputs[0][d]]
        if len(cut) == 1:
            for dst in range(len(x)):
                if dst in (cut[0], batch) or x[dst] <= x[cut[0]] - record.outputs[0][cut[0]]:
                    continue
                code = _index_code(record, cut[0], dst) or f"{who}[…] on axis {dst}"
                out.append(Candidate(_site_step(record, code, rewrite="move-index", **{"from": cut[0], "to": dst}),
                                     f"the indexing is meant for axis {dst} (size {x[dst]}), not axis {cut[0]} "
                                     f"(size {x[cut[0]]})"))
    if op in _DIM_OPS:
        dim = record.args.get("dim", record.args.get("1"))
        if isinstance(dim, int):
            for d in range(len(x)):
                if d != dim % max(len(x), 1) and d != batch:
                    out.append(Candidate(_site_step(record, f"{op}(dim={d})", dim=d),
                                         f"`{op}` is meant over axis {d} (size {x[d]})",
                                         decides=f"which axis of `{who}` `{op}` acts on"))
            if op in _REDUCTIONS and record.args.get("keepdim") is not True:
                out.append(Candidate(_site_step(record, f"{op}(dim={dim}, keepdim=True)", rewrite="keepdim"),
                                     f"`{op}` keeps the reduced axis"))
    if op == "view":
        out.append(Candidate(_site_step(record, f"{who}.reshape(…)", **{"with": "reshape"}), "the view needs a copy"))
    if op in _MOVES:
        out.append(Candidate(_site_step(record, f"{who} (without .{op}(…))", rewrite="drop"),
                             f"`{who}` is already in the layout wanted (the `{op}` is not meant)"))
    if op in _MATMUL and len(record.inputs) == 2:
        a, b = _matmul_operands(record)
        decides = f"which axis of {b} indexes the coordinates of {a} (its rows or its columns)"
        out.append(Candidate(_site_step(record, f"{op} with its operands swapped", rewrite="swap"),
                             "the operands are in the other order", decides=decides))
        for which in (0, 1):
            out.append(Candidate(_site_step(record, f"operand {which}.transpose(-2, -1)", transpose=which),
                                 f"operand {which} is transposed", decides=decides))
    if op in ("cat", "stack", "concat"):
        dim = record.args.get("dim", record.args.get("1", 0))
        for d in range(len(x) + (op == "stack")):
            if isinstance(dim, int) and d != dim % max(len(x) + (op == "stack"), 1) and d != batch:
                out.append(Candidate(_site_step(record, f"{op}(…, dim={d})", dim=d), f"the join is along axis {d}"))
    return out


def failure_candidates(ctx, batch: int = 0) -> List[Candidate]:
    """Edits at the failure itself: the op's operands (dtype, rank, heads, size) or the layer's
    input (axis move, size argument, ``batch_first``, dtype)."""
    failed = ctx.failed_op
    if failed is not None:
        return _operand_candidates(failed)
    return _layer_candidates(ctx)


def _operand_candidates(failed) -> List[Candidate]:
    from layerlab.probe.context import op_tensors

    record, out = failed.record, []
    ts = op_tensors(failed)
    op = record.op
    if op in _INDEXING and len(ts) >= 2:
        source, index = ts[0], ts[1]
        if index.is_floating_point():
            out.append(Candidate(_site_step(record, "index.long()", rewrite="convert", arg=2, to="long"),
                                 "the index holds integer positions"))
        if index.dim() < source.dim():
            out.append(Candidate(_site_step(record, "index.unsqueeze(-1).expand(…)", rewrite="gather-index"),
                                 "one index per row, the same for every feature"))
    if "masked_fill" in op and len(ts) >= 2 and ts[1].dtype != torch.bool:
        out.append(Candidate(_site_step(record, "mask.bool()", rewrite="convert", arg=1, to="bool"),
                             "the mask holds True/False"))
    complex_ = [i for i, t in enumerate(ts) if t.is_complex()]
    if complex_ and len(complex_) < len(ts) and complex_[0] < len(failed.args):
        out.append(Candidate(_site_step(record, "x.real", rewrite="convert", arg=complex_[0], to="real"),
                             "the real part is meant"))
    if len(ts) >= 2 and op in _MATMUL | {"F.scaled_dot_product_attention", "scaled_dot_product_attention"}:
        a, b = ts[0], ts[1]
        if a.dim() == b.dim() >= 3:
            for d in range(a.dim() - 2):
                small, big = sorted((a.shape[d], b.shape[d]))
                if small != big and small > 0 and big % small == 0 and small > 1:
                    which = [0 if a.shape[d] == small else 1]
                    if op.endswith("scaled_dot_product_attention"):
                        which = [i for i in (1, 2) if i < len(ts) and ts[i].shape[d] == small]
                    out.append(Candidate(_site_step(record, f".repeat_interleave({big // small}, dim={d})",
                                                    rewrite="repeat", args=which, repeats=big // small, dim=d),
                                         f"{small} key/value heads shared by groups of {big // small} query heads"))
    if op in _JOINS and len(ts) >= 2 and ts[0].dim() == ts[1].dim() >= 4:  # images: (N, C, H, W …)
        a, b = ts[0], ts[1]
        spatial = [d for d in range(2, a.dim()) if a.shape[d] != b.shape[d]]
        if spatial and a.shape[:2] == b.shape[:2] or (spatial and op in ("cat", "concat")):
            n = a.dim() - 2
            listed = op in ("cat", "concat", "stack")
            for which, other in ((0, b), (1, a)):
                t = ts[which]
                size = list(other.shape[2:])
                where = {"item": which} if listed else {"arg": which}
                bigger = all(t.shape[2 + k] >= size[k] for k in range(n))
                for how in (("interpolate",) if t.is_floating_point() and n <= 3 else ()) + (("crop",) if bigger else ("pad",)):
                    text = {"crop": f"crop operand {which} to {size}", "pad": f"F.pad operand {which} to {size}",
                            "interpolate": f"F.interpolate(operand {which}, size={tuple(size)})"}[how]
                    out.append(Candidate(_site_step(record, text, rewrite="fit", how=how, size=size, **where),
                                         f"operand {which}'s map is meant to be {tuple(size)} ({how})"))
    return out


def _layer_candidates(ctx) -> List[Candidate]:
    m, out = ctx.module, []
    if m is None:
        return out
    xs = ctx.tensors()
    if not xs:
        return out
    x = xs[0]
    key = ctx.locate(x)
    key = 0 if key is None else key
    numel = sum(p.numel() for p in m.parameters() if not is_lazy(p))
    for cls, name, axis in _SIZE_ARGS:
        if isinstance(m, cls) and x.dim() > (axis if axis >= 0 else -axis - 1) and getattr(m, name, None) != x.shape[axis]:
            if name == "in_channels" and getattr(m, "groups", 1) != 1:
                continue
            got = int(x.shape[axis])
            out.append(Candidate(FixStep("set-arg", ctx.path, f"{name}={got}", {"name": name, "value": got}),
                                 f"`{ctx.path}` is meant to take {got} features", params_changed=max(numel, 1)))
    if isinstance(m, (torch.nn.RNNBase, torch.nn.MultiheadAttention)):
        flip = not m.batch_first
        out.append(Candidate(FixStep("set-attr", ctx.path, f"batch_first={flip}", {"name": "batch_first", "value": flip}),
                             f"`{ctx.path}` is meant to read {'(N, L, …)' if flip else '(L, N, …)'}"))
    if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and x.is_floating_point():
        out.append(Candidate(FixStep("cast-input", ctx.path, "x.long()", {"arg": key, "to": "long"}), "the input holds ids"))
    for other in xs[1:]:  # a (T, B) mask where (B, T) is wanted: the other arguments' axes swapped
        where = ctx.locate(other)
        if other.dim() == 2 and where is not None and other.shape[0] != other.shape[1]:
            name = where if isinstance(where, str) else f"argument {where}"
            out.append(Candidate(FixStep("permute-input", ctx.path, f"{name}.t()", {"arg": where, "dims": [1, 0]}),
                                 f"`{name}` is laid out {tuple(other.shape[::-1])}"))
    if x.is_floating_point() and x.dim() in (3, 4) and not isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
        perms = [(0, 2, 1)] if x.dim() == 3 else [(0, 3, 1, 2), (0, 2, 3, 1)]
        for dims in perms:
            out.append(Candidate(FixStep("permute-input", ctx.path, f"x.permute{dims}", {"arg": key, "dims": list(dims)}),
                                 f"`{ctx.path}`'s input has its axes in the order {dims}"))
    return out


def candidates(ctx, batch: int = 0) -> List[Candidate]:
    """Every edit of the grammar at the failure and at the sites upstream of it, nearest first."""
    found = failure_candidates(ctx, batch)
    failed = ctx.failed_op
    for distance, record in enumerate(sites(ctx), start=0 if failed is not None else 1):
        for c in op_candidates(record, batch):
            c.distance = distance
            found.append(c)
    unique, seen = [], set()
    for c in found:
        key = (c.step.kind, c.step.where, repr(sorted(c.step.params.items(), key=lambda kv: kv[0])))
        if key not in seen:
            seen.add(key)
            unique.append(c)
    return unique[:MAX_CANDIDATES]


def search(module, args, kwargs, seed, mode, ctx, *, failed_at: str, deadline,
           exclude: Tuple = (), free=None) -> List[Scored]:
    """The candidates that make a copy of ``module`` run, judged by the oracles, best first, until
    ``deadline`` (a :class:`~layerlab.engine.oracles.Budget`) is over (``free``: the original's free axes, :func:`layerlab.engine.oracles.original_free_axes`)."""
    from layerlab.engine.oracle_sizes import flattened_inputs, original_free_axes
    from layerlab.engine.oracles import batch_axis, judge
    from layerlab.probe.fixes import FixError, FixedModel, apply_step
    from layerlab.probe.verify_fix import copy_model, traced_forward

    scored: List[Scored] = []
    if free is None:
        free = original_free_axes(module, args, kwargs, seed, ctx, deadline)
    from layerlab.engine.upstream_args import upstream_candidates

    for c in candidates(ctx, batch_axis(module, failed_at)) + upstream_candidates(module, args, kwargs, seed, mode, ctx):
        if deadline.over():
            break
        if (c.step.where, c.step.code) in exclude:
            continue
        clone = copy_model(module, mode)
        if clone is None:
            break
        fixed = FixedModel(clone, {})
        try:
            apply_step(fixed, c.step)
            with torch.no_grad():
                outcome = traced_forward(fixed.model, args, kwargs, seed, fixed.substitutions)
        except (FixError, Exception):  # noqa: BLE001 - a candidate that cannot even be applied is dropped
            continue
        if not outcome.ok:
            continue
        verdict = judge(fixed, module, args, kwargs, seed, failed_at=failed_at, edited=edited_sites([c.step]),
                        resized=resized_layers(module, [c.step]), steps=[c.step], flattened=flattened_inputs(ctx),
                        trace=ctx.trace, budget_s=max(0.05, deadline.left()), free=free)
        scored.append(Scored(c, verdict, outcome.outputs))
    return sorted(scored, key=lambda s: s.rank)


def edited_sites(steps) -> set:
    """The module paths and ``file:line`` sites a list of fixes changes (how a later failure is
    recognised as the fix's own doing)."""
    found = set()
    for s in steps:
        if s.kind == "replace-op":
            if s.where:
                found.add(s.where)
        elif s.where:
            found.add(f"{s.where} (")
    return found


def resized_layers(module: torch.nn.Module, steps) -> dict:
    """``path → (argument, old size, new size)`` for the ``set-arg`` fixes of one int size."""
    found = {}
    for s in steps:
        value = s.params.get("value")
        if s.kind == "set-arg" and isinstance(value, int) and not isinstance(value, bool):
            try:
                old = getattr(module.get_submodule(s.where), s.params["name"], None)
            except AttributeError:
                continue
            if isinstance(old, int) and not isinstance(old, bool):
                found[s.where] = (s.params["name"], old, value)
    return found


def parameters_changed(module: torch.nn.Module, steps) -> int:
    """How many parameters the fixes rebuild (``set-arg`` makes a layer anew)."""
    total = 0
    for s in steps:
        if s.kind == "set-arg":
            try:
                total += max(1, sum(p.numel() for p in module.get_submodule(s.where).parameters() if not is_lazy(p)))
            except AttributeError:
                total += 1
    return total

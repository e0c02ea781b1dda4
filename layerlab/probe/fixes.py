"""Apply a diagnosis's fix to a *copy* of the model: the mechanics behind verified fixes.

:func:`apply_fixes` deep-copies the model and applies each :class:`~layerlab.probe.report.FixStep`
to the copy, never to the user's model:

* ``permute-input`` / ``reshape-input`` / ``cast-input``: a forward pre-hook on the module at
  ``where`` changes that one argument (and a forward hook permutes the output back when the fix
  keeps the layout, ``restore``);
* ``set-attr``: sets an attribute that forward reads (``batch_first``, ``config.problem_type``), weights kept;
* ``call-kwarg``: adds a keyword argument to the module's calls (``output_size=`` of a ConvTranspose);
* ``set-arg``: rebuilds the module with one constructor argument changed (the other arguments read
  back from the module; its weights are new, as a user's edit would make them);
* ``replace-op``: one op at one source line is called differently (``view`` → ``reshape``, another
  ``dim`` for ``cat``, a transposed operand, a converted mask), through the op trace's
  substitutions while the copy runs.

The result is a :class:`FixedModel`: an ``nn.Module`` whose forward runs the fixed copy (with the
substitutions active), so a test can compare it with a model fixed by hand.
"""

from __future__ import annotations

import inspect as pyinspect
from typing import Any, Callable, Dict, Sequence, Tuple

import torch
import torch.nn as nn

from layerlab.probe.report import FixStep
from layerlab.target.copying import copy_model


class FixError(Exception):
    """A fix that cannot be applied to this model (the verification then says why)."""


def _convert(value: Any, to: str) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    if to == "long":
        return value.long()
    if to == "detach":  # an input given without requires_grad
        return value.detach()
    if to == "bool":
        return value.bool()
    if to == "eq0":
        return value == 0
    if to.startswith("not:"):  # "not:insert:1,1": a True-means-padding mask reshaped and inverted
        return ~_convert(value, to[len("not:"):])
    if to.startswith("insert:"):  # new size-1 axes: "insert:1,1" → x[:, None, None, :]
        for dim in to[len("insert:"):].split(","):
            value = value.unsqueeze(int(dim))
        return value
    if to.startswith("crop:"):  # "crop:10,10" → mask[:10, :10] (a max_len causal mask cut to the sequence)
        rows, cols = (int(v) for v in to[len("crop:"):].split(","))
        return value[..., :rows, :cols]
    if to.startswith("narrow:"):  # "narrow:1:32" → x[:, :32] (a sequence cut to the model's length)
        dim, length = (int(v) for v in to[len("narrow:"):].split(":"))
        return value.narrow(dim, 0, min(length, value.shape[dim]))
    if to.startswith("movedim:"):  # "movedim:-1:1": (N, T, C) logits → (N, C, T)
        src, dst = (int(v) for v in to[len("movedim:"):].split(":"))
        return value.movedim(src, dst)
    if to.startswith("expand:"):  # "expand:1:3": a size-1 axis repeated (gray pixels → RGB)
        dim, size = (int(v) for v in to[len("expand:"):].split(":"))
        sizes = [-1] * value.dim()
        sizes[dim] = size
        return value.expand(*sizes)
    if to.startswith("keep:"):  # "keep:front:1": a padding mask given j columns of keep (False / 0.) for a CLS token
        side, count = to[len("keep:"):].split(":")
        zeros = value.new_zeros(*value.shape[:-1], int(count))
        return torch.cat([zeros, value] if side == "front" else [value, zeros], dim=-1)
    if to.startswith("padto:"):  # "padto:5:0": token ids padded on the right to 5 with the padding id 0
        length, fill = (int(v) for v in to[len("padto:"):].split(":"))
        return torch.nn.functional.pad(value, (0, max(0, length - value.shape[-1])), value=fill)
    if to.startswith("select:"):  # "select:1:-1": x[:, -1] (an RNN's last step for a sequence classifier)
        dim, position = (int(v) for v in to[len("select:"):].split(":"))
        return value.select(dim, position)
    if to == "starts":  # EmbeddingBag lengths → offsets (each bag's start)
        return torch.cat([value.new_zeros(1), value.cumsum(0)[:-1]])
    if to.startswith("argmax:"):  # one-hot rows → class indices
        return value.argmax(int(to[len("argmax:"):]))
    if to.startswith("squeeze:"):
        return value.squeeze(int(to[len("squeeze:"):]))
    if to.startswith("interpolate:"):  # "interpolate:16,16:bilinear": logits resized to a mask's size
        size, mode = to[len("interpolate:"):].split(":")
        return torch.nn.functional.interpolate(value, size=[int(v) for v in size.split(",")], mode=mode,
                                               align_corners=False)
    if to.startswith("shape:"):  # "shape:4,1+float32": a target shaped (and cast) like the logits
        shape, _, dtype = to[len("shape:"):].partition("+")
        value = value.reshape([int(v) for v in shape.split(",")])
        return value.to(getattr(torch, dtype)) if dtype else value
    if to == "real":  # a complex tensor where a real one is wanted
        return value.real
    if to.startswith(("cpu", "cuda", "mps", "xpu", "meta")):
        return value.to(to)
    return value.to(getattr(torch, to))


#: The public name of :func:`_convert` (the edit grammar's ``convert`` rewrite uses it).
convert = _convert


def _change_input(kind: str, params: Dict[str, Any]) -> Callable[[Any], Any]:
    if kind == "permute-input":
        dims = params["dims"]
        return lambda x: x.permute(*dims)
    if kind == "reshape-input":
        if params["op"] == "flatten":
            start, end = params.get("start", 0), params.get("end", -1)
            return lambda x: x.flatten(start, end)
        if params["op"] == "first":  # an RNN's (output, state) passed whole: keep the output
            return lambda x: x[0] if isinstance(x, (tuple, list)) else x
        dim = params["dim"]
        if params["op"] == "repeat_interleave":  # an (N, L, S) mask → (N·heads, L, S)
            return lambda x: x.repeat_interleave(params["repeats"], dim=dim)
        return lambda x: x.unsqueeze(dim)
    to = params["to"]
    return lambda x: _convert(x, to)


def _pre_hook(arg, change):
    if isinstance(arg, list):  # several arguments changed alike (input_ids and attention_mask cut to one length)
        hooks = [_pre_hook(one, change) for one in arg]

        def each(module, args, kwargs):
            for hook in hooks:
                args, kwargs = hook(module, args, kwargs) or (args, kwargs)
            return args, kwargs
        return each

    def hook(module, args, kwargs):
        if isinstance(arg, int):
            if arg >= len(args):
                return None
            args = (*args[:arg], change(args[arg]), *args[arg + 1:])
        elif arg in kwargs:
            kwargs = {**kwargs, arg: change(kwargs[arg])}
        return args, kwargs

    return hook


def _restore_hook(dims):
    def hook(module, args, output):
        if isinstance(output, torch.Tensor):
            return output.permute(*dims)
        return None

    return hook


def _keyword_hook(name: str, value: Any):
    def hook(module, args, kwargs):
        return args, {**kwargs, name: value}

    return hook


def _move_hook(arg, name: str):
    def hook(module, args, kwargs):
        if isinstance(arg, int):
            if arg >= len(args):
                return None
            value, args = args[arg], (*args[:arg], None, *args[arg + 1:])
        elif arg in kwargs:
            value, kwargs = kwargs[arg], {k: v for k, v in kwargs.items() if k != arg}
        else:
            return None
        return args, {**kwargs, name: value}

    return hook


_ATTR_FOR_ARG = {"bias": lambda m: getattr(m, "bias", None) is not None}


def rebuild(module: nn.Module, changes: Dict[str, Any]) -> nn.Module:
    """A new module of the same class with ``changes`` to its constructor arguments; the others
    are read back from the module's attributes (torch.nn keeps them under the same names)."""
    cls = type(module)
    try:
        # RNN/LSTM/GRU take (*args, **kwargs) and hand them to RNNBase, whose names they keep
        sig = pyinspect.signature(nn.RNNBase.__init__ if isinstance(module, nn.RNNBase) else cls.__init__)
    except (TypeError, ValueError) as exc:
        raise FixError(f"cannot read {cls.__name__}'s constructor arguments") from exc
    kwargs = {}
    if isinstance(module, nn.RNN):
        kwargs["nonlinearity"] = module.nonlinearity
    for name, p in list(sig.parameters.items())[1:]:
        if isinstance(module, nn.RNNBase) and (name == "mode" or (name == "proj_size" and not isinstance(module, nn.LSTM))):
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name in changes:
            kwargs[name] = changes[name]
        elif name in ("device", "dtype"):
            continue
        elif name in _ATTR_FOR_ARG:
            kwargs[name] = _ATTR_FOR_ARG[name](module)
        elif name == "elementwise_affine" and hasattr(module, "elementwise_affine"):
            kwargs[name] = module.elementwise_affine
        elif hasattr(module, name) and not isinstance(getattr(module, name), (torch.Tensor, nn.Module)):
            kwargs[name] = getattr(module, name)
        elif p.default is p.empty:
            raise FixError(f"cannot rebuild {cls.__name__}: its argument {name!r} is not an attribute")
    try:
        new = cls(**kwargs)
    except Exception as exc:
        raise FixError(f"{cls.__name__}({', '.join(f'{k}={v!r}' for k, v in changes.items())}) cannot be built: {exc}") from exc
    like = next(iter(module.parameters()), None)
    if like is not None:
        new = new.to(device=like.device, dtype=like.dtype if like.is_floating_point() else None)
    new.train(module.training)
    return new


_HOOK_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
               "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


def _set_submodule(root: nn.Module, path: str, new: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    setattr(parent, name, new)


def _permute_operand(which: int, dims) -> Callable:
    """``einsum(eq, a, b)`` (or ``einsum(eq, [a, b])``) with operand ``which`` permuted by ``dims``."""
    def permute(func, args, kwargs):
        if len(args) == 2 and isinstance(args[1], (list, tuple)):
            ops = list(args[1])
            ops[which] = ops[which].permute(*dims)
            return func, (args[0], ops), kwargs
        args = list(args)
        args[1 + which] = args[1 + which].permute(*dims)
        return func, tuple(args), kwargs
    return permute


def _substitution(params: Dict[str, Any]) -> Callable:
    """How to call one op differently (the op trace applies it at its source line)."""
    if "rewrite" in params:  # a change picked by name (an einsum equation, reshape sizes …)
        from layerlab.probe.op_rewrites import substitution

        return substitution(params)
    if params.get("with") == "cat":  # torch.stack → torch.cat along the dim the shapes differ on
        dim = params["dim"]
        return lambda func, args, kwargs: (torch.cat, args[:1], {"dim": dim})
    if "squeeze_dims" in params:  # a bare squeeze() limited to the dims after the batch
        dims = tuple(params["squeeze_dims"])
        return lambda func, args, kwargs: (torch.Tensor.squeeze, (args[0], dims), {})
    if params.get("with") == "reshape":
        return lambda func, args, kwargs: (torch.Tensor.reshape, args, kwargs)
    if "operand" in params:  # one einsum operand permuted
        return _permute_operand(params["operand"], params["dims"])
    if "dims" in params:  # a permute redone with other dims
        dims = params["dims"]
        return lambda func, args, kwargs: (torch.Tensor.permute, (args[0], *dims), {})
    if "dim" in params:
        dim = params["dim"]
        keep = params.get("keep_args", 1)  # chunk(2, dim=0): the chunk count stays, only the dim changes
        return lambda func, args, kwargs: (func, args[:keep], {**{k: v for k, v in kwargs.items() if k != "dim"}, "dim": dim})
    if "transpose" in params:
        which = params["transpose"]

        def transpose(func, args, kwargs):
            args = list(args)
            args[which] = args[which].transpose(-2, -1)
            return func, tuple(args), kwargs
        return transpose
    arg, to = params["arg"], params["to"]

    def convert(func, args, kwargs):
        if isinstance(arg, int) and arg < len(args):
            args = (*args[:arg], _convert(args[arg], to), *args[arg + 1:])
        elif arg in kwargs:
            kwargs = {**kwargs, arg: _convert(kwargs[arg], to)}
        return func, args, kwargs
    return convert


def _chain(first: Callable, then: Callable) -> Callable:
    def both(func, args, kwargs):
        return then(*first(func, args, kwargs))
    return both


class FixedModel(nn.Module):
    """A fixed copy of a model: ``model`` is the copy, ``substitutions`` the ops it calls
    differently. Calling it runs the copy with those substitutions active."""

    def __init__(self, model: nn.Module, substitutions: Dict[Tuple[str, int, str], Callable]) -> None:
        super().__init__()
        self.model = model
        self.substitutions = substitutions

    def forward(self, *args, **kwargs):
        if not self.substitutions:
            return self.model(*args, **kwargs)
        from layerlab.probe.ops import tracing

        with tracing(self.model, self.substitutions):
            return self.model(*args, **kwargs)


def apply_step(fixed: FixedModel, step: FixStep) -> None:
    """Apply one fix to the copy inside ``fixed`` (raise :class:`FixError` if it cannot be)."""
    root, p = fixed.model, step.params
    if step.kind == "replace-op":
        if not p.get("file") or p.get("line") is None:
            raise FixError("the op's source line is unknown")
        key, change = (p["file"], p["line"], p["op"]), _substitution(p)
        before = fixed.substitutions.get(key)
        if before is not None:  # a second fix of the same call (an int mask cast, then reshaped): both apply
            change = _chain(before, change)
        fixed.substitutions[key] = change
        return
    try:
        target = root.get_submodule(step.where) if step.where else root
    except AttributeError as exc:
        raise FixError(f"no module {step.where!r} in the copy") from exc
    if step.kind in ("permute-input", "reshape-input", "cast-input"):
        target.register_forward_pre_hook(_pre_hook(p["arg"], _change_input(step.kind, p)), with_kwargs=True)
        if p.get("restore"):
            target.register_forward_hook(_restore_hook(p["restore"]))
    elif step.kind == "set-attr":  # a dotted name reaches into an attribute: "config.problem_type"
        *owners, name = p["name"].split(".")
        for owner in owners:
            target = getattr(target, owner)
        setattr(target, name, p["value"])
    elif step.kind == "move-input":  # an argument passed under the wrong name: attn_mask → key_padding_mask
        target.register_forward_pre_hook(_move_hook(p["arg"], p["to_name"]), with_kwargs=True)
    elif step.kind == "call-kwarg":  # one keyword argument added to the module's calls: output_size=…
        target.register_forward_pre_hook(_keyword_hook(p["name"], p["value"]), with_kwargs=True)
    elif step.kind == "set-arg":
        new = rebuild(target, {p["name"]: p["value"], **p.get("also", {})})  # also: a depthwise conv's groups
        if not step.where:
            raise FixError("rebuilding the whole model is not a fix layerlab makes")
        for hooks in _HOOK_DICTS:  # an earlier step's permute of this module's input stays
            if hasattr(target, hooks):
                setattr(new, hooks, getattr(target, hooks))
        _set_submodule(root, step.where, new)
    else:
        raise FixError(f"unknown fix kind {step.kind!r}")


def apply_fixes(model: nn.Module, steps: Sequence[FixStep]) -> FixedModel:
    """A :class:`FixedModel`: a deep copy of ``model`` with ``steps`` applied (``model`` untouched).

        >>> fixed = apply_fixes(model, report.failure.diagnosis.verified.steps)
        >>> fixed(x).shape
    """
    try:
        clone = copy_model(model)
    except Exception as exc:
        raise FixError(f"the model cannot be copied ({type(exc).__name__}: {exc})") from exc
    fixed = FixedModel(clone, {})
    for step in steps:
        apply_step(fixed, step)
    return fixed

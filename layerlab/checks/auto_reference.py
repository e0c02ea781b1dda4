"""No reference given: compare a layer that plainly mirrors a torch.nn layer with that layer.

A hand-written ``MyGRUCell`` with ``input_size``/``hidden_size`` attributes and parameters shaped
like ``nn.GRUCell``'s should equal ``nn.GRUCell`` carrying its weights; comparing the two finds
wrong gate orders, transposed weights and wrong normalisations that no reference-free check can.

A wrong automatic reference would produce a false FAIL, which is worse than no check, so every
condition below must hold, or no automatic comparison is made (the report says why in a note):

1. the class name contains a torch.nn layer's name (:data:`MIRRORS`, longest first, case
   sensitive: GPT-2's ``Conv1D`` is a linear layer, not a ``Conv1d``); torch.nn's own classes,
   and subclasses that keep torch's ``forward``, are never compared with themselves;
2. the torch.nn layer can be built from the layer's own attributes: every argument that changes
   the maths (``eps``, ``batch_first``, ``nonlinearity`` …) must be an attribute, never a guess;
   ``bias``-like flags are read from which parameters exist;
3. every parameter maps onto exactly one of the torch.nn layer's and back: by name, else by shape
   (name tokens break ties); transposed only for a non-square shape seen only transposed;
4. a float64 trial call: the torch.nn layer accepts the inputs and returns the same structure,
   with the same shapes.

The report names the reference and the mapping used (``Alignment.auto``, shown as the reference note).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from layerlab.checks.reference import Alignment, align, with_input_binding

__all__ = ["auto_reference", "MIRRORS", "Mirror", "map_parameters"]


@dataclass(frozen=True)
class Mirror:
    """How to build one torch.nn layer from a look-alike's attributes.

    Attributes:
        name: the torch.nn class (``GRUCell``); also what the class name must contain.
        required: constructor arguments that must be attributes of the layer (or derived by ``derive``).
        optional: arguments taken when the layer has the attribute (torch's default otherwise:
            a wrong default changes shapes, which the trial call catches).
        flags: boolean arguments decided by which parameters exist (each value is tried; exactly
            one must map).
        derive: argument → function of the layer giving it when it is not an attribute.
        guard: returns why the built arguments are not enough to be sure (``None``: they are).
    """

    name: str
    required: Tuple[str, ...]
    optional: Tuple[str, ...] = ()
    flags: Tuple[str, ...] = ()
    derive: Dict[str, Callable[[nn.Module], Any]] = field(default_factory=dict)
    guard: Optional[Callable[[Dict[str, Any]], Optional[str]]] = None


def _weight_shape(module: nn.Module) -> Optional[Tuple[int, ...]]:
    """A norm's ``normalized_shape``: its ``weight``'s shape, else the one shape all its own
    parameters share (``gamma``/``beta``)."""
    w = getattr(module, "weight", None)
    if isinstance(w, torch.Tensor):
        return tuple(w.shape)
    shapes = {tuple(p.shape) for p in module.parameters(recurse=False)}
    return shapes.pop() if len(shapes) == 1 else None


def _weight_dim0(module: nn.Module) -> Optional[int]:
    shape = _weight_shape(module)
    return shape[0] if shape else None


def _padding_needs_mode(kwargs: Dict[str, Any]) -> Optional[str]:
    pad = kwargs.get("padding", 0)
    if pad not in (0, (0,), (0, 0), (0, 0, 0), "valid") and "padding_mode" not in kwargs:
        return "it pads but has no padding_mode attribute (zeros, reflect, replicate or circular?)"
    return None


_RNN_OPTIONAL = ("num_layers", "bidirectional", "dropout")
_CONV = dict(required=("in_channels", "out_channels", "kernel_size"),
             optional=("stride", "padding", "dilation", "groups", "padding_mode"), flags=("bias",),
             guard=_padding_needs_mode)

#: the torch.nn layers a look-alike is compared with, longest name first (``GRUCell`` before ``GRU``)
MIRRORS: Tuple[Mirror, ...] = tuple(sorted((
    Mirror("MultiheadAttention", ("embed_dim", "num_heads", "batch_first"), ("kdim", "vdim"), ("bias",)),
    Mirror("LayerNorm", ("normalized_shape", "eps"), (), ("elementwise_affine", "bias"),
           derive={"normalized_shape": _weight_shape}),
    Mirror("RMSNorm", ("normalized_shape", "eps"), (), ("elementwise_affine",),
           derive={"normalized_shape": _weight_shape}),
    Mirror("GroupNorm", ("num_groups", "num_channels", "eps"), (), ("affine",),
           derive={"num_channels": _weight_dim0}),
    Mirror("LSTMCell", ("input_size", "hidden_size"), (), ("bias",)),
    Mirror("GRUCell", ("input_size", "hidden_size"), (), ("bias",)),
    Mirror("RNNCell", ("input_size", "hidden_size", "nonlinearity"), (), ("bias",)),
    Mirror("LSTM", ("input_size", "hidden_size", "batch_first"), _RNN_OPTIONAL + ("proj_size",), ("bias",)),
    Mirror("GRU", ("input_size", "hidden_size", "batch_first"), _RNN_OPTIONAL, ("bias",)),
    Mirror("RNN", ("input_size", "hidden_size", "batch_first", "nonlinearity"), _RNN_OPTIONAL, ("bias",)),
    Mirror("Embedding", ("num_embeddings", "embedding_dim"), ("padding_idx", "max_norm", "norm_type",
                                                               "scale_grad_by_freq")),
    Mirror("Linear", ("in_features", "out_features"), (), ("bias",)),
    Mirror("Conv1d", **_CONV), Mirror("Conv2d", **_CONV), Mirror("Conv3d", **_CONV),
    Mirror("MaxPool1d", ("kernel_size", "stride"), ("padding", "dilation", "ceil_mode")),
    Mirror("MaxPool2d", ("kernel_size", "stride"), ("padding", "dilation", "ceil_mode")),
    Mirror("AvgPool1d", ("kernel_size", "stride"), ("padding", "ceil_mode", "count_include_pad")),
    Mirror("AvgPool2d", ("kernel_size", "stride"), ("padding", "ceil_mode", "count_include_pad")),
), key=lambda m: -len(m.name)))


def auto_reference(module: nn.Module, args: Sequence[Any]) -> Alignment:
    """The aligned torch.nn counterpart of ``module``, or ``Alignment(None, note=why not)``."""
    mirror = _mirror_of(module)
    if mirror is None:
        return Alignment(None)
    cls = getattr(nn, mirror.name)
    if _is_torch_itself(module, cls):
        return Alignment(None)
    why_not = f"{type(module).__name__} looks like torch.nn.{mirror.name}, but it was not compared automatically"
    kwargs, missing = _constructor_kwargs(module, mirror)
    if missing:
        return Alignment(None, note=f"{why_not}: no attribute {', '.join(missing)} to build it from")
    guard = mirror.guard(kwargs) if mirror.guard is not None else None
    if guard and mirror.guard is _padding_needs_mode:
        return _padding_by_trial(module, args, mirror, kwargs, why_not, guard)
    if guard:
        return Alignment(None, note=f"{why_not}: {guard}")
    return _aligned(module, args, mirror, kwargs, why_not)


#: torch's padding modes, the default first
PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _padding_by_trial(module: nn.Module, args: Sequence[Any], mirror: Mirror, kwargs: Dict[str, Any],
                      why_not: str, guard: str) -> Alignment:
    """A conv that pads but does not say how: the one of torch's four padding modes it equals exactly
    (float64) is its reference. Equal to none, it is compared with nothing: it may pad in a way torch
    does not (symmetric, say), so a difference is no verdict; but it is said, as a warning."""
    from layerlab.checks.variants import flipped_kernel

    built, seen, flipped = 0, "", None
    for mode in PADDING_MODES:
        alignment = _aligned(module, args, mirror, {**kwargs, "padding_mode": mode}, why_not)
        if alignment.reference is None:
            continue
        built += 1
        same, shift = _equal_outputs(module, alignment.reference, args)
        seen = seen or (f" (against padding_mode={mode!r}: {shift})" if shift else "")
        if same:
            chosen = f"; padding_mode={mode!r} is not an attribute: of torch's four it is the one the layer equals"
            return replace(alignment, auto=alignment.auto + chosen, note=alignment.note + chosen)
        if flipped is None and _equal_outputs(module, flipped_kernel(alignment.reference), args)[0]:
            flipped = (mode, alignment)
    if flipped is not None:  # the padding is torch's; the kernel is reversed: a real bug, compared as such
        mode, alignment = flipped
        chosen = (f"; padding_mode={mode!r} (not an attribute): with it the layer equals torch's only with the "
                  "kernel flipped")
        return replace(alignment, auto=alignment.auto + chosen, note=alignment.note + chosen)
    if not built:
        return Alignment(None, note=f"{why_not}: {guard}")
    return Alignment(None, note=f"{why_not}: {guard}", suspect=(
        f"{type(module).__name__} has torch.nn.{mirror.name}'s attributes and parameters but equals it under none of "
        f"torch's padding modes ({', '.join(PADDING_MODES)}) on these inputs{seen}: a bug (padding on the wrong side, an "
        "off-by-one), or a padding torch does not have; set padding_mode, or name a reference, to compare"))


def _equal_outputs(module: nn.Module, reference: Any, args: Sequence[Any]) -> Tuple[bool, str]:
    """Do the float64 eval outputs agree; and, if not, is the first one the reference's shifted?"""
    from layerlab.checks.case import call, cast_args, float_leaves, module_copy, reference_copy
    from layerlab.checks.patterns import mismatch, pattern

    a = cast_args(args, torch.float64)
    try:
        with torch.no_grad():
            lo = float_leaves(call(module_copy(module, torch.float64, False), a))
            lr = float_leaves(call(reference_copy(reference, torch.float64, False), a))
    except Exception:
        return False, ""
    if len(lo) == len(lr) and all(x.shape == y.shape and not mismatch(x, y).any() for (_, x), (_, y) in zip(lo, lr)):
        return True, ""
    found = pattern(lo[0][1], lr[0][1]) if lo and lr else None
    return False, (found.text if found is not None and found.kind == "shifted" else "")


def _aligned(module: nn.Module, args: Sequence[Any], mirror: Mirror, kwargs: Dict[str, Any], why_not: str) -> Alignment:
    """``module``'s torch.nn counterpart built with ``kwargs``, weights mapped and tried on ``args``."""
    cls = getattr(nn, mirror.name)
    built = _build_and_map(module, cls, mirror, kwargs)
    if isinstance(built, str):
        return Alignment(None, note=f"{why_not}: {built}")
    ref, used, mapping = built
    alignment = align(module, ref, {o: t for o, t in mapping.items() if o != t})
    if alignment.reference is None:
        return Alignment(None, note=f"{why_not}: {alignment.error}")
    alignment = with_input_binding(alignment, module, args)
    trouble = _trial_call(module, alignment.reference, args)
    if trouble:
        return Alignment(None, note=f"{why_not}: {trouble}")
    sibling = _equals_sibling(module, mirror, kwargs, args)
    if sibling:
        return Alignment(None, note=f"{why_not}: it computes torch.nn.{sibling} (named like {mirror.name}, "
                                    f"as T5's LayerNorm is an RMSNorm)")
    shown = ", ".join(f"{k}={v!r}" for k, v in used.items())
    renamed = {o: t for o, t in mapping.items() if o != t}
    how = (f"weights mapped {', '.join(f'{o}→{t}' for o, t in renamed.items())}" if renamed
           else "weights copied by name" if mapping else "no weights")
    auto = f"auto-reference torch.nn.{mirror.name}({shown}), built from {type(module).__name__}'s attributes; {how}"
    extra = alignment.note.split("; ", 1)[1] if "; " in alignment.note else ""
    return replace(alignment, label=f"torch.nn.{mirror.name}", auto=auto,
                   note=auto + (f"; {extra}" if extra else ""))


def _mirror_of(module: nn.Module) -> Optional[Mirror]:
    name = type(module).__name__.replace("MultiHeadAttention", "MultiheadAttention")
    return next((m for m in MIRRORS if m.name in name), None)


def _is_torch_itself(module: nn.Module, cls: type) -> bool:
    """torch.nn's own classes, and subclasses of the counterpart that keep its forward."""
    if type(module).__module__.startswith("torch."):
        return True
    return isinstance(module, cls) and type(module).forward is cls.forward


def _constructor_kwargs(module: nn.Module, mirror: Mirror) -> Tuple[Dict[str, Any], List[str]]:
    kwargs: Dict[str, Any] = {}
    missing: List[str] = []
    for arg in mirror.required:
        value = getattr(module, arg, None) if hasattr(module, arg) else None
        if not hasattr(module, arg) and arg in mirror.derive:
            value = mirror.derive[arg](module)
        if value is None and not (hasattr(module, arg) and arg == "eps"):
            missing.append(arg)
        else:
            kwargs[arg] = value
    for arg in mirror.optional:
        if hasattr(module, arg) and _plain(getattr(module, arg)):
            kwargs[arg] = getattr(module, arg)
    bad = [k for k, v in kwargs.items() if not _plain(v)]
    return kwargs, missing + [f"{k} (a {type(kwargs[k]).__name__})" for k in bad]


def _plain(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def _build_and_map(module: nn.Module, cls: type, mirror: Mirror, kwargs: Dict[str, Any]):
    """Build ``cls`` with each value of the flags; exactly one must map every parameter."""
    fits = []
    errors = []
    for values in itertools.product((True, False), repeat=len(mirror.flags)):
        trial = {**kwargs, **dict(zip(mirror.flags, values))}
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                ref = cls(**trial)
        except Exception as exc:  # arguments torch rejects: not this layer
            errors.append(f"torch.nn.{cls.__name__}({_show(trial)}) cannot be built: {exc}")
            continue
        mapping = map_parameters(module, ref)
        if isinstance(mapping, dict):
            fits.append((ref, trial, mapping))
        else:
            errors.append(mapping)
    if len(fits) != 1:
        return ("its parameters do not map onto torch's one to one: " + "; ".join(errors[:1]) if not fits
                else "its parameters map onto more than one construction")
    ref, trial, mapping = fits[0]
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), None)
    return (ref.to(dtype) if dtype is not None else ref), trial, mapping


def _show(kwargs: Dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


_ALIASES = {"w": "weight", "b": "bias", "kernel": "weight", "gamma": "weight", "beta": "bias", "scale": "weight"}


def _tokens(name: str) -> set:
    parts = [p for p in re.split(r"[._]", name.lower()) if p]
    return {_ALIASES.get(p, p) for p in parts}


def map_parameters(ours: nn.Module, ref: nn.Module) -> Any:
    """Our parameter → the reference's (``name.T`` when stored transposed), one to one; or why not (a str).

    Same name and shape first; then the one reference parameter of the same shape, ties broken by
    the most shared name tokens (``W_ih`` ~ ``weight_ih``); a 2-D non-square parameter may map
    transposed when no same-shape candidate exists.
    """
    theirs = {n: tuple(p.shape) for n, p in ref.named_parameters()}
    mine = {n: tuple(p.shape) for n, p in ours.named_parameters()}
    if len(theirs) != len(mine):
        return (f"{len(mine)} parameter(s) ({', '.join(mine) or 'none'}) vs torch's {len(theirs)} "
                f"({', '.join(theirs) or 'none'})")
    out: Dict[str, str] = {}
    free = dict(theirs)
    for name, shape in mine.items():
        if free.get(name) == shape:
            out[name] = name
            del free[name]
    for name, shape in mine.items():
        if name in out:
            continue
        same = [t for t, s in free.items() if s == shape]
        flipped = [t for t, s in free.items() if len(shape) == 2 and shape[0] != shape[1] and s == shape[::-1]]
        cands, suffix = (same, "") if same else (flipped, ".T")
        if len(cands) > 1:
            scores = {t: len(_tokens(name) & _tokens(t)) for t in cands}
            best = max(scores.values())
            cands = [t for t in cands if scores[t] == best]
        if len(cands) != 1:
            return (f"{name} {shape} matches {'none' if not cands else ' and '.join(cands)} of torch's "
                    "parameters")
        out[name] = cands[0] + suffix
        del free[cands[0]]
    return out


#: layers a look-alike's name may claim while it computes the other (T5LayerNorm is an RMSNorm)
_SIBLINGS = {"LayerNorm": "RMSNorm", "RMSNorm": "LayerNorm"}


def _equals_sibling(module: nn.Module, mirror: Mirror, kwargs: Dict[str, Any], args: Sequence[Any]) -> Optional[str]:
    """The sibling torch.nn layer the module equals exactly (then its name misleads), or ``None``."""
    from layerlab.checks.case import call, cast_args, float_leaves, module_copy, reference_copy
    from layerlab.checks.patterns import mismatch

    name = _SIBLINGS.get(mirror.name)
    if name is None:
        return None
    other = next(m for m in MIRRORS if m.name == name)
    built = _build_and_map(module, getattr(nn, name), other, {k: v for k, v in kwargs.items() if k in other.required})
    if isinstance(built, str):
        return None
    aligned = align(module, built[0], {o: t for o, t in built[2].items() if o != t})
    if aligned.reference is None:
        return None
    a = cast_args(args, torch.float64)
    try:
        with torch.no_grad():
            lo = float_leaves(call(module_copy(module, torch.float64, False), a))
            lr = float_leaves(call(reference_copy(aligned.reference, torch.float64, False), a))
    except Exception:
        return None
    same = len(lo) == len(lr) and all(x.shape == y.shape and not mismatch(x, y).any() for (_, x), (_, y) in zip(lo, lr))
    return name if same else None


def _trial_call(module: nn.Module, reference: Any, args: Sequence[Any]) -> Optional[str]:
    """Why the reference cannot stand in for ``module`` on these inputs (``None``: it can)."""
    from layerlab.checks.case import call, cast_args, flatten, module_copy, reference_copy

    a = cast_args(args, torch.float64)
    try:
        with torch.no_grad():
            out_o = call(module_copy(module, torch.float64, False), a)
    except Exception:  # the layer itself fails: the runs check reports it
        return "the layer does not run in float64 eval mode"
    try:
        with torch.no_grad():
            out_r = call(reference_copy(reference, torch.float64, False), a)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"torch's layer rejects the inputs ({type(exc).__name__}: {first[:160]})"
    lo, lr = flatten(out_o), flatten(out_r)
    shapes_o = [(p, tuple(t.shape)) for p, t in lo]
    shapes_r = [(p, tuple(t.shape)) for p, t in lr]
    if shapes_o != shapes_r:
        why = f"the outputs differ in structure or shape (ours {shapes_o}, torch's {shapes_r})"
        nones = [i for i, (o, r) in enumerate(zip(out_o, out_r)) if o is None and isinstance(r, torch.Tensor)] \
            if isinstance(out_o, (tuple, list)) and isinstance(out_r, (tuple, list)) else []
        if nones:
            why += (f"; ours returns None at output[{nones[0]}] where torch's returns a tensor: run with the "
                    "argument that turns it off in torch too (MultiheadAttention: need_weights=False) to compare")
        return why
    return None

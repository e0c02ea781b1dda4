"""Give the reference the layer's weights, so the two can be compared output for output.

The layer's weights are the truth: they are copied *into* a deep copy of the reference (never the
other way round, and never into the user's objects). How:

1. by name: every reference parameter takes the layer's tensor of the same name, or of the name
   ``weight_map`` gives (``{our_name: their_name}``; ``their_name.T`` copies transposed, for a
   layer that stores ``W`` as ``(in, out)``);
2. otherwise through the layer's own ``to_torch()`` when it returns the reference's class
   (layerlab's layers can always convert themselves);
3. otherwise the alignment fails and says which reference parameters found no source.

Buffers are not weights. The rule: a buffer is **state** when ``forward`` updates it as it runs
(BatchNorm's ``running_mean``/``running_var``/``num_batches_tracked``, any ``running_*``): state
is copied like a weight, since two modules that saw different batches legitimately differ there.
Every other buffer is **structure**, computed once from the hyperparameters (a positional table,
a causal mask, RoPE's ``inv_freq``): the reference keeps its own, and forward parity compares ours
with it, so a table built wrong is a finding rather than something copied over and hidden. A
buffer named in ``weight_map`` is copied (the way out for a buffer drawn at random).

Inputs are handed to the reference the way its ``forward`` takes them (:class:`BindInputs`): by
keyword only where the reference has a parameter of that name, otherwise by position, so a layer
whose ``forward(x, h)`` mirrors ``GRUCell.forward(input, hx)`` is compared, not rejected.

A plain function can be a reference too (it has no weights; only outputs and input gradients are
compared then).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from layerlab.checks.case import class_path
from layerlab.target.copying import copy_model


@dataclass
class Alignment:
    """The reference carrying the layer's weights, or why there is none.

    Attributes:
        reference: the aligned reference (a module copy or a callable), ``None`` if alignment failed.
        param_map: our parameter name → the reference's (``name.T`` when transposed).
        note: how the weights were copied (and, when the signatures differ, how inputs are passed).
        error: why they could not be (then ``reference`` is ``None``).
        unmatched: reference parameters that found no source (when ``error``).
        label: what the report names as the reference (``torch.nn.GRUCell``); empty for none.
        auto: how an automatic reference was built, when layerlab chose it (empty when the user did).
        state_buffers: buffers copied as state (see the module docstring).
        suspect: no reference, but what layerlab saw trying to build one points at a bug (a warning).
    """

    reference: Any
    param_map: Dict[str, str] = field(default_factory=dict)
    note: str = ""
    error: Optional[str] = None
    unmatched: List[str] = field(default_factory=list)
    label: str = ""
    auto: str = ""
    state_buffers: List[str] = field(default_factory=list)
    suspect: str = ""


#: buffer names that hold running state, whatever module owns them
_STATE_BUFFER_NAMES = ("num_batches_tracked",)


def is_state_buffer(name: str) -> bool:
    """Is the buffer ``name`` (qualified) state that ``forward`` updates, rather than structure?
    Running statistics are: ``running_mean``, ``running_var``, ``num_batches_tracked``, ``running_*``."""
    leaf = name.rsplit(".", 1)[-1]
    return leaf.startswith("running_") or leaf in _STATE_BUFFER_NAMES


def align(ours: nn.Module, reference: Any, weight_map: Optional[Dict[str, str]] = None) -> Alignment:
    """Copy ``ours``'s weights (and state buffers) into a copy of ``reference`` (see the module docstring)."""
    if reference is None:
        return Alignment(None)
    label = class_path(reference)
    if isinstance(reference, type) and issubclass(reference, nn.Module):
        out = _via_to_torch(ours, reference, "the reference is a class; need an instance or to_torch()")
        out.label = label
        return out
    if not isinstance(reference, nn.Module):
        if callable(reference):
            return Alignment(reference, note="a function: no weights to copy", label=label)
        return Alignment(None, error=f"the reference must be an nn.Module or a callable, got {type(reference).__name__}")
    ref = copy_model(reference)
    wmap = dict(weight_map or {})
    unknown = sorted(set(wmap) - set(ours.state_dict()))
    if unknown:
        return Alignment(None, error=f"weight_map names {unknown} that {type(ours).__name__} does not have "
                                     f"(it has {sorted(ours.state_dict())})")
    ours_sd = ours.state_dict(keep_vars=True)
    ref_sd = ref.state_dict(keep_vars=True)
    our_params = {n for n, _ in ours.named_parameters()}
    pairs: Dict[str, str] = {}
    problems: List[str] = []
    for name, tensor in ours_sd.items():
        if name not in our_params and name not in wmap and not is_state_buffer(name):
            continue  # structure: the reference keeps its own, forward parity compares them
        spec = wmap.get(name, name)
        transpose = spec.endswith(".T")
        theirs = spec[:-2] if transpose else spec
        if theirs not in ref_sd:
            if name in wmap:
                problems.append(f"weight_map {name} → {spec}: the reference has no {theirs!r}")
            continue
        shape = tuple(tensor.shape[::-1]) if transpose else tuple(tensor.shape)
        if shape != tuple(ref_sd[theirs].shape):
            problems.append(f"{name} {tuple(tensor.shape)}{' transposed' if transpose else ''} "
                            f"≠ {theirs} {tuple(ref_sd[theirs].shape)}")
            continue
        pairs[name] = spec
    covered = {spec[:-2] if spec.endswith(".T") else spec for spec in pairs.values()}
    unmatched = [n for n, _ in ref.named_parameters() if n not in covered]
    if unmatched or problems:
        fallback = _via_to_torch(ours, type(reference), None)
        if fallback.error is None and not wmap:
            fallback.label = label
            return fallback
        detail = "; ".join(problems + ([f"reference parameters with no source: {unmatched}"] if unmatched else []))
        return Alignment(None, error=f"cannot copy {type(ours).__name__}'s weights into {class_path(reference)}: "
                                     f"{detail}", unmatched=unmatched)
    with torch.no_grad():
        for name, spec in pairs.items():
            theirs = spec[:-2] if spec.endswith(".T") else spec
            src = ours_sd[name].detach()
            src = src.t() if spec.endswith(".T") else src
            dst = ref_sd[theirs]
            dst.data = src.to(dtype=dst.dtype if not dst.is_floating_point() else src.dtype).clone()
    ref.train(ours.training)
    how = "by name" + (f" with weight_map {wmap}" if wmap else "")
    state = [n for n in pairs if n not in our_params]
    note = f"weights copied {how}" + (f"; state buffers copied: {', '.join(state)}" if state else "")
    return Alignment(ref, {n: s for n, s in pairs.items() if n in our_params}, note=note, label=label,
                     state_buffers=state)


def _via_to_torch(ours: nn.Module, ref_cls: type, why: Optional[str]) -> Alignment:
    to_torch = getattr(ours, "to_torch", None)
    if not callable(to_torch):
        return Alignment(None, error=why or f"{type(ours).__name__} has no to_torch()")
    ref = to_torch()
    if not isinstance(ref, ref_cls):
        return Alignment(None, error=f"{type(ours).__name__}.to_torch() returns {type(ref).__name__}, "
                                     f"not {ref_cls.__name__}")
    ref.train(ours.training)
    return Alignment(ref, _match_names(ours, ref), note=f"weights copied with {type(ours).__name__}.to_torch()")


def _match_names(ours: nn.Module, ref: nn.Module) -> Dict[str, str]:
    """Our parameter → the reference's: the same name, else the one name ours ends with
    (``proj.weight`` → ``weight``), shapes equal."""
    theirs = dict(ref.named_parameters())
    out = {}
    for name, p in ours.named_parameters():
        if name in theirs and theirs[name].shape == p.shape:
            out[name] = name
            continue
        cands = [t for t, q in theirs.items() if name.endswith("." + t) and q.shape == p.shape]
        if len(cands) == 1:
            out[name] = cands[0]
    return out


# the output transform is part of a Target's reference (spec: reference: {output: …})
from layerlab.target.references import parse_output_transform  # noqa: E402,F401


class OutputAdapter(nn.Module):
    """A reference whose output is reshaped to the layer's layout before comparing (the weights
    stay in ``inner``)."""

    def __init__(self, inner: nn.Module, transform: str) -> None:
        super().__init__()
        self.inner = inner
        self.transform = transform
        self._fn = parse_output_transform(transform)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(self.inner(*args, **kwargs))


def with_output_transform(alignment: Alignment, transform: Optional[str]) -> Alignment:
    """Wrap an aligned module reference so its output is ``transform``-ed (names gain ``inner.``)."""
    if not transform or alignment.reference is None:
        return alignment
    ref = alignment.reference
    if isinstance(ref, nn.Module):
        wrapped = OutputAdapter(ref, transform)
        pmap = {k: "inner." + v for k, v in alignment.param_map.items()}
    else:
        fn = parse_output_transform(transform)
        wrapped, pmap = (lambda *a, **k: fn(ref(*a, **k))), {}
    return dataclasses.replace(alignment, reference=wrapped, param_map=pmap,
                               note=f"{alignment.note}; reference output → .{transform.lstrip('.')}")


# -- handing the inputs over -----------------------------------------------------------------------

def _signature(fn: Any) -> Optional[inspect.Signature]:
    target = fn.forward if isinstance(fn, nn.Module) else fn
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


class BindInputs:
    """A forward pre-hook (``with_kwargs``) that rebinds the layer's call to the reference's ``forward``.

    A keyword the reference names stays a keyword; a keyword it does not name (``x`` for
    ``GRUCell``'s ``input``) moves to the position it has in the layer's own ``forward``;
    positional arguments stay where they are. A hook rather than a wrapper module, so the
    reference's parameter and submodule names stay as they are.
    """

    def __init__(self, layer_params: Sequence[str], ref_params: Sequence[str], ref_var_kw: bool) -> None:
        self.layer_params = list(layer_params)
        self.ref_params = set(ref_params)
        self.ref_var_kw = ref_var_kw

    def bind(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        slots = dict(enumerate(args))
        kw: Dict[str, Any] = {}
        for name, value in kwargs.items():
            if name in self.ref_params:
                kw[name] = value
            elif name in self.layer_params and self.layer_params.index(name) not in slots:
                slots[self.layer_params.index(name)] = value
            elif self.ref_var_kw:
                kw[name] = value
            else:
                raise TypeError(f"the reference's forward takes no argument {name!r} and it has no position "
                                f"to go to (the layer's forward: {', '.join(self.layer_params)})")
        if sorted(slots) != list(range(len(slots))):
            missing = [self.layer_params[i] for i in range(max(slots) + 1) if i not in slots and
                       i < len(self.layer_params)]
            raise TypeError(f"cannot pass the inputs to the reference by position: {', '.join(missing)} "
                            "not given, and the reference does not take the later ones by name")
        return tuple(slots[i] for i in range(len(slots))), kw

    def __call__(self, module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]):
        return self.bind(args, kwargs)


def input_binding(ours: nn.Module, reference: Any, args: Sequence[Any]) -> Optional[Tuple[BindInputs, str]]:
    """``(binder, description)`` when some keyword input of ``args`` (:class:`~layerlab.checks.case.Arg`)
    is not a parameter name of the reference's ``forward``; ``None`` when the call passes as it is."""
    sig_r = _signature(reference)
    sig_o = _signature(ours)
    if sig_r is None or sig_o is None:
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ref_params = [p.name for p in sig_r.parameters.values() if p.kind in kinds]
    keywords = [a.name for a in args if a.keyword]
    moved = [n for n in keywords if n not in ref_params]
    if not moved:
        return None
    layer_params = [p.name for p in sig_o.parameters.values()
                    if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    var_kw = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in sig_r.parameters.values())
    binder = BindInputs(layer_params, ref_params, var_kw)
    name = type(reference).__name__ if isinstance(reference, nn.Module) else getattr(reference, "__name__", "reference")
    shown = ", ".join(p for p in ref_params[:4])
    return binder, (f"the signatures differ: {', '.join(moved)} passed by position to {name}.forward({shown}"
                    f"{', …' if len(ref_params) > 4 else ''})")


def with_input_binding(alignment: Alignment, ours: nn.Module, args: Sequence[Any]) -> Alignment:
    """Make the aligned reference accept the layer's inputs (see :class:`BindInputs`); says so in the note."""
    ref = alignment.reference
    if ref is None:
        return alignment
    found = input_binding(ours, ref, args)
    if found is None:
        return alignment
    binder, how = found
    if isinstance(ref, nn.Module):
        ref.register_forward_pre_hook(binder, with_kwargs=True)
        bound: Any = ref
    else:
        def bound(*a: Any, **k: Any) -> Any:
            pos, kw = binder.bind(a, k)
            return ref(*pos, **kw)
    return dataclasses.replace(alignment, reference=bound, note=f"{alignment.note}; {how}" if alignment.note else how)


def prepare(ours: nn.Module, args: Sequence[Any], reference: Any, weight_map: Optional[Dict[str, str]] = None,
            output_transform: Optional[str] = None, *, auto: bool = True) -> Alignment:
    """The reference every parity check uses: the user's (aligned, inputs bound, output transformed),
    else an automatic torch.nn counterpart (:mod:`layerlab.checks.auto_reference`) when ``auto``."""
    if reference is None and auto and not weight_map:
        from layerlab.checks.auto_reference import auto_reference

        return auto_reference(ours, args)
    alignment = align(ours, reference, weight_map)
    return with_output_transform(with_input_binding(alignment, ours, args), output_transform)

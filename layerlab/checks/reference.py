"""Give the reference the layer's weights, so the two can be compared output for output.

The layer's weights are the truth: they are copied *into* a deep copy of the reference (never the
other way round, and never into the user's objects). How:

1. by name: every reference parameter and buffer takes the layer's tensor of the same name, or of
   the name ``weight_map`` gives (``{our_name: their_name}``; ``their_name.T`` copies transposed,
   for a layer that stores ``W`` as ``(in, out)``);
2. otherwise through the layer's own ``to_torch()`` when it returns the reference's class
   (layerlab's layers can always convert themselves);
3. otherwise the alignment fails and says which reference parameters found no source.

A plain function can be a reference too (it has no weights; only outputs and input gradients are
compared then).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch
from torch import nn

from layerlab.checks.case import class_path


@dataclass
class Alignment:
    """The reference carrying the layer's weights, or why there is none.

    Attributes:
        reference: the aligned reference (a module copy or a callable), ``None`` if alignment failed.
        param_map: our parameter name → the reference's (``name.T`` when transposed).
        note: how the weights were copied.
        error: why they could not be (then ``reference`` is ``None``).
        unmatched: reference parameters that found no source (when ``error``).
    """

    reference: Any
    param_map: Dict[str, str] = field(default_factory=dict)
    note: str = ""
    error: Optional[str] = None
    unmatched: List[str] = field(default_factory=list)


def align(ours: nn.Module, reference: Any, weight_map: Optional[Dict[str, str]] = None) -> Alignment:
    """Copy ``ours``'s weights into a copy of ``reference`` (see the module docstring)."""
    if reference is None:
        return Alignment(None)
    if isinstance(reference, type) and issubclass(reference, nn.Module):
        return _via_to_torch(ours, reference, "the reference is a class; need an instance or to_torch()")
    if not isinstance(reference, nn.Module):
        if callable(reference):
            return Alignment(reference, note="a function: no weights to copy")
        return Alignment(None, error=f"the reference must be an nn.Module or a callable, got {type(reference).__name__}")
    ref = copy.deepcopy(reference)
    wmap = dict(weight_map or {})
    unknown = sorted(set(wmap) - set(ours.state_dict()))
    if unknown:
        return Alignment(None, error=f"weight_map names {unknown} that {type(ours).__name__} does not have "
                                     f"(it has {sorted(ours.state_dict())})")
    ours_sd = ours.state_dict(keep_vars=True)
    ref_sd = ref.state_dict(keep_vars=True)
    pairs: Dict[str, str] = {}
    problems: List[str] = []
    for name, tensor in ours_sd.items():
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
    params = {n for n, _ in ours.named_parameters()}
    how = "by name" + (f" with weight_map {wmap}" if wmap else "")
    return Alignment(ref, {n: s for n, s in pairs.items() if n in params}, note=f"weights copied {how}")


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


#: tensor methods a reference output transform may use (``flatten(2).transpose(1, 2)``)
_OUTPUT_METHODS = ("flatten", "unflatten", "transpose", "permute", "reshape", "squeeze", "unsqueeze", "movedim",
                   "contiguous")


def parse_output_transform(text: str) -> Callable[[Any], Any]:
    """A chain of tensor methods with integer arguments, e.g. ``flatten(2).transpose(1, 2)``,
    as a function; applied to the output (the first output when it is a tuple). Never evaluates code."""
    steps = []
    rest = text.strip()
    pattern = re.compile(r"\.?\s*([A-Za-z_]+)\s*\(([-\d,\s()]*)\)\s*")
    while rest:
        m = pattern.match(rest)
        if not m or m.group(1) not in _OUTPUT_METHODS:
            raise ValueError(f"cannot read the output transform {text!r}: expected a chain of "
                             f"{', '.join(_OUTPUT_METHODS)} with integer arguments, e.g. 'flatten(2).transpose(1, 2)'")
        nums = re.findall(r"-?\d+", m.group(2))
        steps.append((m.group(1), [int(n) for n in nums]))
        rest = rest[m.end():]

    def apply(y: Any) -> Any:
        if isinstance(y, tuple) and y:
            return (apply(y[0]),) + tuple(y[1:])
        for method, nums in steps:
            y = getattr(y, method)(*nums) if method != "permute" else y.permute(*nums)
        return y

    return apply


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
    return Alignment(wrapped, pmap, note=f"{alignment.note}; reference output → .{transform.lstrip('.')}",
                     error=alignment.error, unmatched=alignment.unmatched)

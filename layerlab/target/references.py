"""A Target's reference: the registry's torch.nn counterpart, or the spec's ``reference:``.

The reference is built under the target's seed and in the module's floating dtype; its weights are
not copied here (the checks align them: :mod:`layerlab.checks.reference`). A reference class that
rejects the layer's arguments is kept as the class, to be aligned through the layer's ``to_torch()``.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

__all__ = ["REFERENCE_OUTPUT", "parse_output_transform", "entry_output", "seeded_reference", "registry_reference", "spec_reference"]

#: registry layers whose output is the reference's in another layout (until LayerEntry carries it)
REFERENCE_OUTPUT = {"patch_embedding": "flatten(2).transpose(1, 2)"}


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


def entry_output(entry) -> Optional[str]:
    return getattr(entry, "reference_output", None) or REFERENCE_OUTPUT.get(entry.name)


def float_dtype(module) -> Any:
    """The dtype of the module's first floating parameter (``None`` if it has none)."""
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), None)


def seeded_reference(ref_cls: Any, seed: int, module, args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
    """``ref_cls(*args, **kwargs)`` built under ``seed``, in ``module``'s float dtype; ``ref_cls``
    itself when it rejects the arguments (the weights are then aligned through the layer's ``to_torch()``)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            reference = ref_cls(*args, **kwargs)
        except Exception:  # arguments the reference does not take: align through the layer's to_torch()
            reference = ref_cls
    if isinstance(reference, torch.nn.Module):
        dtype = float_dtype(module)
        if dtype is not None:
            reference = reference.to(dtype)
    return reference


def registry_reference(spec, module, seed: int) -> Tuple[Any, Optional[str]]:
    """A spec whose layer is a registry layer is compared with that entry's reference by default."""
    from layerlab import registry
    from layerlab.spec.schema import LayerNode

    root = spec.root
    if not isinstance(root, LayerNode) or root.repeat != 1 or getattr(root.resolved, "kind", None) != "registry":
        return None, None
    entry = registry.find(root.resolved.name)
    if entry is None:
        return None, None
    ref_cls = entry.load_reference()
    if ref_cls is None:
        return None, None
    return seeded_reference(ref_cls, seed, module, root.args, root.kwargs), entry_output(entry)


def spec_reference(ref_spec: Any, data: Dict[str, Any], marks, seed: int, module, allow_import: bool,
                    base_dir: str) -> Tuple[Any, Optional[Dict[str, str]]]:
    """The spec's ``reference:`` built with its ``args:`` (or the spec's), and its ``weight_map:``."""
    import torch

    from layerlab.errors import SpecError
    from layerlab.spec.resolve import resolve_layer

    weight_map = None
    if isinstance(ref_spec, str):
        name, args = ref_spec, data.get("args")
    elif isinstance(ref_spec, dict) and "layer" in ref_spec:
        unknown = [k for k in ref_spec if k not in ("layer", "args", "weight_map", "output")]
        if unknown:
            raise SpecError(f"unknown key {unknown[0]!r} in reference:", where=marks("reference", unknown[0]),
                            expected="layer, args, weight_map, output", got=unknown[0])
        name, args = ref_spec["layer"], ref_spec.get("args", data.get("args"))
        weight_map = ref_spec.get("weight_map")
    else:
        raise SpecError("reference: names the layer this one should equal", where=marks("reference"),
                        expected="a layer name (nn.LSTM) or {layer: …, args: {…}, weight_map: {…}}", got=ref_spec)
    resolved = resolve_layer(str(name), where=marks("reference"), allow_import=allow_import, base_dir=base_dir)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            if isinstance(args, dict):
                ref = resolved.cls(**args)
            elif isinstance(args, list):
                ref = resolved.cls(*args)
            else:
                ref = resolved.cls() if args is None else resolved.cls(args)
        except Exception as exc:
            raise SpecError(f"the reference {resolved.name}(…) rejected its arguments: {exc}",
                            where=marks("reference"), hint="give the reference its own args: under reference:") from None
    dtype = float_dtype(module)
    return (ref.to(dtype) if dtype is not None else ref), weight_map

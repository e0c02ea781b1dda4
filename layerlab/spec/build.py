"""A checked :class:`Spec` → the module and the inputs, ready for :func:`layerlab.inspect`.

Weights are initialised under the spec's seed inside ``torch.random.fork_rng`` (the global RNG
is left as it was). The model is then moved to the spec's device, and cast to its float dtype
*only when the spec asks for one* (``dtype:`` or ``--dtype``): a model the user's code builds in
float64 (or with a float64 buffer) stays so, as it would in their own script — the CLI must not
hide a dtype bug that the Python API shows.

A constructor or factory that rejects its arguments (torch checks some only there, e.g.
``embed_dim`` divisible by ``num_heads``) is a :class:`SpecError` at the layer's line; one that
fails importing a module says which, and where (:func:`layerlab.spec.objects.call`). A factory
must return an ``nn.Module``.

``build(spec, meta=True)`` (or ``Overrides(meta=True)``) calls the constructors inside
``with torch.device("meta"):``: parameters get shapes and no storage, so a 7-billion-parameter
config builds in seconds and a few hundred MB; nothing is moved to a device. The inputs stay real
CPU tensors (``inspect(..., meta=True)`` makes meta twins of them).

A padding mask bound to the wrong convention is refused: torch's ``key_padding`` / ``padding_mask
{convention: ignore}`` (True = ignore) given to the ``attention_mask`` of a Hugging Face model
(1 = keep), or a ``keep`` mask given to a torch ``*key_padding_mask`` — either silently inverts
which tokens are attended.
"""

from __future__ import annotations

import inspect as pyinspect
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Union

from layerlab.errors import SpecError
from layerlab.spec import limits
from layerlab.spec.inputs import bind, make_inputs
from layerlab.spec.objects import build_value, call
from layerlab.spec.schema import BlockNode, InputSpec, LayerNode, Spec


@dataclass
class Built:
    """What a spec builds: the module, its forward arguments, and how to run it.

    ``inputs`` holds every argument in call order, keyed as passed: a keyword argument by its
    ``forward`` parameter name (also the key in ``kwargs``), a positional one by its input name.
    """

    module: Any
    args: List[Any]
    kwargs: Dict[str, Any]
    inputs: Dict[str, Any]
    mode: str
    backward: bool
    seed: int


def build(spec: Spec, *, meta: bool = False) -> Built:
    """Instantiate the spec's model and generate its inputs (``meta``: the model on torch's meta device)."""
    import torch

    from layerlab.spec.memory import check_fits, check_inputs_fit

    meta = meta or spec.meta
    with limits.clean_errors():
        if meta:
            check_inputs_fit(spec, limits.available_memory())  # the inputs are real tensors
        else:
            check_fits(spec, lambda: _build(spec.root))  # refuses, with numbers, what cannot fit
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            if meta:
                with torch.device("meta"):
                    module = _build(spec.root)
            else:
                module = _build(spec.root)
        module = _place(module, spec, meta)
        values = make_inputs(spec.inputs, seed=spec.seed, dtype=spec.dtype, device=spec.device,
                             device_where=spec.device_where)
    from layerlab.spec.validate import root_class

    cls = root_class(spec) or type(module)
    positional, keyword = bind(cls, list(values), spec.source, cls.__name__,
                               where_of={s.name: s.where for s in spec.inputs})
    kwargs = {param: values[name] for param, name in keyword.items()}
    args = [values[n] for n in positional]
    _check_mask_conventions(module, spec, args, kwargs, values)
    return Built(
        module=module,
        args=args,
        kwargs=kwargs,
        inputs={**{n: values[n] for n in positional}, **kwargs},
        mode=spec.mode,
        backward=spec.backward,
        seed=spec.seed,
    )


def _place(module, spec: Spec, meta: bool):
    """Cast to the spec's dtype only if it asked for one; move to its device unless on meta."""
    import torch

    dtype = getattr(torch, spec.dtype) if spec.dtype_given else None
    try:
        if meta:
            return module.to(dtype=dtype) if dtype is not None else module
        return module.to(device=spec.device, dtype=dtype) if dtype is not None else module.to(device=spec.device)
    except RecursionError:  # nested deeper than Python's recursion limit, not the device's fault: the run
        from layerlab.faults import watch_model  # guard (layerlab.faults) says so

        watch_model(module)
        raise
    except (RuntimeError, AssertionError, ValueError) as exc:
        raise SpecError(f"cannot move the model to device {spec.device!r}: {limits.first_line(exc)}",
                        where=spec.device_where or spec.source,
                        hint="use --device cpu, or a device this machine has") from None


def _build(node: Union[LayerNode, BlockNode]):
    import torch.nn as nn

    def one():
        return _instantiate(node) if isinstance(node, LayerNode) else _sequential(node)

    if node.repeat == 1:
        return one()
    return nn.Sequential(*[one() for _ in range(node.repeat)])


def _sequential(block: BlockNode):
    import torch.nn as nn

    children = OrderedDict()
    for i, item in enumerate(block.items):
        name = item.child_name or str(i)
        if name in children:
            raise SpecError(f"two block items are named {name!r}", where=item.where,
                            hint="item names default to their position; pick another name")
        children[name] = _build(item)
    return nn.Sequential(children)


def _instantiate(node: LayerNode):
    import torch.nn as nn

    resolved = node.resolved
    args = [build_value(a) for a in node.args]
    kwargs = {k: build_value(a) for k, a in node.kwargs.items()}
    module = call(resolved.cls, args, kwargs, resolved.name, node.where)
    if not isinstance(module, nn.Module):
        raise SpecError(
            f"{resolved.name}(…) returned {type(module).__module__}.{type(module).__name__}, not an nn.Module",
            where=node.where, expected="an nn.Module", got=type(module).__name__,
            hint="a factory must return the model itself (wrap one that returns (model, extras) "
                 "in a function of your own)",
        )
    return module


def _check_mask_conventions(module, spec: Spec, args: List[Any], kwargs: Dict[str, Any],
                            values: Dict[str, Any]) -> None:
    """Refuse a padding mask whose convention is the opposite of the parameter it is bound to."""
    masks = {id(values[s.name]): s for s in spec.inputs if _convention(s) is not None}
    if not masks:
        return
    try:
        bound = pyinspect.signature(module.forward).bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):
        return
    hf = type(module).__module__.startswith("transformers.")
    for param, value in bound.items():
        s = masks.get(id(value))
        if s is None:
            continue
        convention = _convention(s)
        if param == "attention_mask" and hf and convention == "ignore":
            raise SpecError(
                f"input {s.name!r} is a torch key-padding mask (True = ignore this token), bound to "
                f"{type(module).__name__}.forward's attention_mask, where Hugging Face reads 1 = keep, 0 = pad: "
                "every real token would be masked and every pad attended",
                where=s.where, expected="padding_mask: {lengths: […], convention: keep}", got=convention,
                hint="write padding_mask: {lengths: [...], convention: keep} (1 = keep, 0 = pad)",
            )
        if param.endswith("key_padding_mask") and convention == "keep":
            raise SpecError(
                f"input {s.name!r} is a keep mask (1 = token, 0 = pad), bound to {param!r}, where torch reads "
                "True = ignore this key: the real tokens would be the ignored ones",
                where=s.where, expected="key_padding: [...] or padding_mask: {…, convention: ignore}", got=convention,
                hint="use convention: ignore (True = pad) for torch's key_padding_mask",
            )


def _convention(s: InputSpec):
    if s.key_padding is not None:
        return "ignore"
    if s.padding is not None:
        return s.padding["convention"]
    return None

"""Will it fit? The memory a spec needs, estimated before anything real is allocated.

A 4 PB input, or a 30 GB one on a machine with 21 GB free, must be refused up front with the
numbers — not die in the allocator ("can't allocate memory", a C++ stack) or, worse, be killed
by the kernel half way through a run. Three estimates, each a *lower bound* of what the run
needs, so a refusal is never a false alarm:

1. the inputs, from their shapes and dtypes (no tensor is made);
2. the parameters and buffers, from the model built on the ``meta`` device (shapes only, no
   storage), in the spec's dtype;
3. the largest single intermediate tensor, from one forward on that meta model with meta inputs,
   recorded by a ``TorchDispatchMode`` (views and in-place results share storage and are not
   counted). Inputs and parameters stay alive through the run, so the peak is at least
   inputs + parameters + this tensor.

Each is compared with :func:`~layerlab.spec.limits.available_memory` (host memory: inputs and
modules are made on the CPU first; the forward estimate only for CPU runs). A step that cannot be
done on ``meta`` (a constructor or forward that reads values) is skipped: no estimate, no refusal.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

from layerlab.errors import SpecError
from layerlab.spec import limits
from layerlab.spec.schema import InputSpec, Spec

ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
            "int8": 1, "uint8": 1, "bool": 1}


@dataclass
class Estimate:
    """Bytes the run needs at least, by part (``None``: could not be estimated)."""

    inputs: int
    params: Optional[int] = None
    largest: Optional[int] = None
    largest_op: Optional[str] = None

    @property
    def total(self) -> int:
        return self.inputs + (self.params or 0) + (self.largest or 0)


def input_bytes(spec: InputSpec, default_dtype: str) -> int:
    """The bytes of the tensor this input becomes (0 for a literal, a file or ``same_as``: a file's size is
    checked when it is loaded)."""
    if spec.items is not None:
        return sum(input_bytes(s, default_dtype) for s in spec.items)
    if spec.literal or spec.same_as is not None or spec.tensor or spec.file is not None:
        return 0
    if spec.padding is not None:
        name = spec.dtype or ("int64" if spec.padding["convention"] == "keep" else "bool")
        return len(spec.padding["lengths"]) * spec.padding["size"] * ITEMSIZE[name]
    if spec.causal is not None:
        L, S = spec.causal
        return L * S * ITEMSIZE[spec.dtype or default_dtype]
    if spec.key_padding is not None:
        return len(spec.key_padding["lengths"]) * spec.key_padding["size"] * ITEMSIZE[spec.dtype or "bool"]
    numel = 1
    for d in spec.shape or []:
        numel *= d
    return numel * ITEMSIZE[spec.dtype or ("int64" if spec.high is not None else default_dtype)]


def check_inputs_fit(spec: Spec, free: Optional[int]) -> int:
    """Refuse inputs that alone exceed ``free`` bytes; return their total."""
    sizes = [(s, input_bytes(s, spec.dtype)) for s in spec.inputs]
    total = sum(n for _, n in sizes)
    if free is not None and total > free:
        biggest, n = max(sizes, key=lambda p: p[1])
        alone = "alone " if n == total else ""
        raise SpecError(
            f"input {biggest.name!r} {alone}needs {limits.format_bytes(n)}"
            + ("" if n == total else f" (all inputs {limits.format_bytes(total)})")
            + f"; {limits.format_bytes(free)} of memory is free",
            where=biggest.where, expected=f"≤ {limits.format_bytes(free)}", got=limits.format_bytes(total),
            hint="use a smaller shape: a batch of 2 and small sizes show the same behaviour",
        )
    return total


def check_model_fits(spec: Spec, build_meta: Callable[[], Any], inputs: int, free: Optional[int]) -> Estimate:
    """Parameters (and, on CPU, the largest intermediate) from a meta-device build; refuse what cannot fit."""
    est = Estimate(inputs=inputs)
    if free is None:
        return est
    meta = _without_dynamo(_meta_model, build_meta, spec.dtype)
    if meta is None:
        return est
    est.params = _param_bytes(meta)
    root_where = spec.root.where
    if est.inputs + est.params > free:
        raise SpecError(
            f"the model's parameters and buffers need {limits.format_bytes(est.params)}"
            + (f" (the inputs another {limits.format_bytes(est.inputs)})" if est.inputs else "")
            + f"; {limits.format_bytes(free)} of memory is free",
            where=root_where, expected=f"≤ {limits.format_bytes(free)}",
            got=limits.format_bytes(est.inputs + est.params),
            hint="use smaller sizes (channels, features, vocabulary) or fewer repeats",
        )
    if str(spec.device).split(":")[0] != "cpu":
        return est
    from layerlab.faults import step, watch_model

    previous = step("while building the model (the shape-only forward that checks the memory it needs)")
    watch_model(meta)  # a --timeout names the submodule by its path
    largest = _without_dynamo(_largest_intermediate, meta, spec)
    step(previous)
    if largest is not None:
        est.largest, est.largest_op = largest
        if est.total > free:
            raise SpecError(
                f"running it needs at least {limits.format_bytes(est.total)}: inputs "
                f"{limits.format_bytes(est.inputs)}, parameters {limits.format_bytes(est.params)} and one "
                f"intermediate of {limits.format_bytes(est.largest)} ({est.largest_op}); "
                f"{limits.format_bytes(free)} of memory is free",
                where=spec.inputs[0].where if spec.inputs else root_where,
                expected=f"≤ {limits.format_bytes(free)}", got=limits.format_bytes(est.total),
                hint="use smaller input sizes (sequence length, image size, batch)",
            )
    return est


def _without_dynamo(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with torch's meta kernels kept from importing ``torch._dynamo`` (see
    :mod:`layerlab.spec.dynamo_stub`); once more the ordinary way when that gave no answer (a torch
    path needing more of dynamo than the stand-in has fails, and is then retried, not skipped)."""
    from layerlab.spec.dynamo_stub import no_dynamo_import

    with no_dynamo_import() as stood_in:
        found = fn(*args)
    if found is None and stood_in:
        found = fn(*args)
    return found


def _meta_model(build_meta: Callable[[], Any], dtype: str):
    import torch

    try:
        with warnings.catch_warnings(), torch.device("meta"), torch.random.fork_rng(devices=[]):
            warnings.simplefilter("ignore")
            module = build_meta()
            return module.to(dtype=getattr(torch, dtype))
    except Exception:  # a constructor that reads values: no estimate
        return None


def _param_bytes(module) -> int:
    from torch.nn.parameter import is_lazy  # a Lazy* module's weights have no size before its first forward

    tensors = {id(t): t for t in [*module.parameters(), *module.buffers()] if not is_lazy(t)}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _largest_intermediate(meta, spec: Spec) -> Optional[Tuple[int, str]]:
    """The biggest tensor one op of a meta forward creates: ``(bytes, op name)``, or ``None``."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from layerlab.spec.inputs import bind

    class Largest(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # torch wraps a mode's __torch_dispatch__ in _disable_dynamo unless this says no, and the
            # first call of that wrapper imports torch._dynamo: about 1 s of every command's start-up
            # for a check that never runs under torch.compile
            return False

        def __init__(self) -> None:
            super().__init__()
            self.best: Tuple[int, str] = (0, "")

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if any(r.alias_info is not None for r in func._schema.returns):
                return out  # a view or an in-place result: no new storage
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    n = t.numel() * t.element_size()
                    if n > self.best[0]:
                        self.best = (n, str(func.overloadpacket.__name__))
            return out

    try:
        values = {s.name: _meta_input(s, spec.dtype) for s in spec.inputs}
        for s in spec.inputs:
            target = s
            while target.same_as is not None:
                target = next(t for t in spec.inputs if t.name == target.same_as)
            values[s.name] = values[target.name]
        positional, keyword = bind(type(meta), list(values), spec.source, type(meta).__name__)
        meta.train(spec.mode == "train")
        mode = Largest()
        with warnings.catch_warnings(), torch.no_grad(), mode:
            warnings.simplefilter("ignore")
            meta(*[values[n] for n in positional], **{p: values[n] for p, n in keyword.items()})
        return mode.best if mode.best[0] else None
    except Exception:  # a forward that reads values (.item(), data-dependent shapes): no estimate
        return None


def _meta_input(spec: InputSpec, default_dtype: str):
    import torch

    if spec.literal:
        return spec.value
    if spec.items is not None:
        from layerlab.spec.input_values import pack

        return pack(spec.container, spec.value, [_meta_input(s, default_dtype) for s in spec.items])
    if spec.file is not None:
        raise LookupError("a file's shape is known once it is loaded")  # no estimate (see the caller)
    if spec.tensor:
        from layerlab.spec.input_values import infer_dtype, tensor_shape

        shape = tensor_shape(spec.value, spec.name, spec.where)
        return torch.empty(shape, dtype=getattr(torch, spec.dtype or infer_dtype(spec.value) or default_dtype),
                           device="meta")
    if spec.padding is not None:
        name = spec.dtype or ("int64" if spec.padding["convention"] == "keep" else "bool")
        shape = (len(spec.padding["lengths"]), spec.padding["size"])
        return torch.empty(shape, dtype=getattr(torch, name), device="meta")
    if spec.causal is not None:
        return torch.empty(spec.causal, dtype=getattr(torch, spec.dtype or default_dtype), device="meta")
    if spec.key_padding is not None:
        shape = (len(spec.key_padding["lengths"]), spec.key_padding["size"])
        return torch.empty(shape, dtype=getattr(torch, spec.dtype or "bool"), device="meta")
    if spec.same_as is not None:
        return None  # filled in by the caller
    name = spec.dtype or ("int64" if spec.high is not None else default_dtype)
    return torch.empty(spec.shape, dtype=getattr(torch, name), device="meta")


def check_fits(spec: Spec, build_meta: Callable[[], Any]) -> Estimate:
    """All three estimates against the free memory (see the module docstring)."""
    free = limits.available_memory()
    inputs = check_inputs_fit(spec, free)
    return check_model_fits(spec, build_meta, inputs, free)


__all__: List[str] = ["Estimate", "check_fits", "input_bytes", "ITEMSIZE"]

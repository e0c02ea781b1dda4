"""``inspect(..., meta=True)``: a shape-only dry run on torch's meta device, and its memory estimate.

A meta tensor has a shape, a dtype and strides but no storage: every torch op computes the output's
metadata (with the same shape checks as a real kernel) and nothing else. Running the forward and
backward on meta therefore yields every module call's shapes and dtypes, and every failure a shape
or dtype mistake causes, for a model of any size and almost no memory: a 7-billion-parameter Llama
built under ``torch.device("meta")`` is inspected in seconds. What meta cannot give: values, so no
statistics, no gradient norms, no NaN checks (the report leaves them empty), and any op that needs
a value (``.item()``, ``if mask.any():``, ``nonzero``, boolean indexing) fails; that failure is
reported as such (see :func:`explain_meta_failure`).

The user's module is never moved: a model with real weights is copied with every parameter,
buffer and plain tensor attribute replaced by a meta twin *before* copying (``copy.deepcopy``'s
memo), so the weights are neither copied nor touched. A model already on meta is run as it is.

Memory estimate (:class:`MetaMemory`): bytes = numel × element size.

    activation   what each call returns (its tensor outputs); the total counts every distinct
                 tensor once (a ``Sequential`` returns its last child's output: not counted twice)
    gradient     the same for the outputs whose gradient the backward pass computed
    parameters   every parameter once; its gradient for the trainable ones

It is the size of what the module calls return, not an allocator's peak: intermediate tensors
inside a module's own forward (attention scores in a fused kernel, for instance) are not module
outputs and are not counted, and autograd may keep less (an in-place op) or more (inputs of
functional ops) for backward.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.nn.parameter import is_lazy

from layerlab.errors import UsageError

META = torch.device("meta")


@dataclass
class LayerMemory:
    """One module call's estimated memory on a real device (bytes)."""

    call: int
    path: str
    class_name: str
    activation_bytes: int
    grad_bytes: int
    param_bytes: int


@dataclass
class MetaMemory:
    """The estimate of a meta run: per call (``layers``, in call order) and in total.

    ``activation_bytes`` / ``grad_bytes`` count every distinct module output (and its gradient)
    once; ``param_bytes`` every parameter once, ``param_grad_bytes`` the trainable ones' gradients.
    """

    layers: List[LayerMemory] = field(default_factory=list)
    activation_bytes: int = 0
    grad_bytes: int = 0
    param_bytes: int = 0
    param_grad_bytes: int = 0
    buffer_bytes: int = 0
    note: str = ("bytes = numel × element size of module outputs, their gradients and the parameters; "
                 "no values exist on meta: statistics and gradient norms are not computed")


def is_all_meta(module: torch.nn.Module) -> bool:
    """Every (materialised) parameter and buffer of ``module`` is on the meta device."""
    return all(t.is_meta for t in (*module.parameters(), *module.buffers()) if not is_lazy(t))


def _meta_twin(t: torch.Tensor) -> torch.Tensor:
    twin = torch.empty_like(t, device=META)
    if isinstance(t, torch.nn.Parameter):
        return torch.nn.Parameter(twin, requires_grad=t.requires_grad)
    return twin.requires_grad_(t.requires_grad) if t.is_floating_point() or t.is_complex() else twin


def meta_module(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` itself when it is on meta already, else a copy whose parameters and buffers are
    meta twins (shapes, dtypes and ``requires_grad`` kept; no weight is copied)."""
    if is_all_meta(module):
        return module
    memo: Dict[int, Any] = {}
    for t in (*module.parameters(), *module.buffers()):
        if not is_lazy(t) and not t.is_meta:
            memo[id(t)] = _meta_twin(t)
    for _, t in _tensor_attributes(module):
        # a tensor kept as a plain attribute: a constant (``self.scale = torch.ones(C)``), or one the
        # old hook API of weight_norm / spectral_norm recomputes from the parameters before every
        # forward (deepcopy refuses that non-leaf tensor). On meta its shape is all there is to copy.
        if id(t) not in memo and not t.is_meta:
            memo[id(t)] = torch.empty_like(t, device=META).requires_grad_(t.requires_grad)
    try:
        twin = copy.deepcopy(module, memo)
    except Exception as exc:
        raise UsageError(
            f"inspect --meta needs a copy of the model and {type(module).__name__} cannot be copied: "
            f"{type(exc).__name__}: {exc}", where="meta", got=type(module).__name__,
            hint='build the model under `with torch.device("meta"):` and pass that (no copy is then made)',
        ) from None
    stray = [name for name, t in _tensor_attributes(twin) if not t.is_meta]
    if stray:  # a plain tensor attribute (not a buffer) stays where it was: meta ops would mix devices
        raise UsageError(
            "inspect --meta can move parameters and buffers only; these tensors are plain attributes: "
            + ", ".join(stray[:4]), where="meta", got=stray[0],
            hint="register them with self.register_buffer(name, tensor, persistent=False), or build the "
                 'model under `with torch.device("meta"):`',
        )
    return twin


def _tensor_attributes(module: torch.nn.Module) -> List[Tuple[str, torch.Tensor]]:
    found = []
    for path, m in module.named_modules():
        for key, value in vars(m).items():
            if isinstance(value, torch.Tensor) and not key.startswith("_"):
                found.append((f"{path}.{key}" if path else key, value))
    return found


def meta_value(value: Any) -> Any:
    """``value`` with every tensor in it (nested tuples, lists, dicts) replaced by a meta twin."""
    if isinstance(value, torch.Tensor):
        if value.is_meta:
            return value
        twin = torch.empty_like(value, device=META)
        return twin.requires_grad_(True) if value.requires_grad else twin
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(meta_value(v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(meta_value(v) for v in value)
    if isinstance(value, dict):
        return {k: meta_value(v) for k, v in value.items()}
    return value


def nbytes(shape: Optional[List[Optional[int]]], dtype: Optional[str]) -> int:
    """numel × element size of a described tensor (0 when a size is unknown: a ragged dimension)."""
    if shape is None or dtype is None or any(s is None for s in shape):
        return 0
    numel = 1
    for s in shape:
        numel *= s
    return numel * _itemsize(dtype)


def _itemsize(dtype: str) -> int:
    t = getattr(torch, dtype, None)
    return t.itemsize if isinstance(t, torch.dtype) else 0


def estimate(recorder, module: torch.nn.Module) -> MetaMemory:
    """The memory estimate of a finished meta run (see the module docstring)."""
    arrived = set(recorder.grad_order)
    seen, seen_grad = set(), set()
    memory = MetaMemory()
    for call in recorder.calls:
        act = grad = 0
        for out in call.tensor_outputs:
            size = nbytes(out.shape, out.dtype)
            act += size
            grad += size if out.slot in arrived else 0
            if out.slot is not None and out.slot not in seen:
                seen.add(out.slot)
                memory.activation_bytes += size
            if out.slot in arrived and out.slot not in seen_grad:
                seen_grad.add(out.slot)
                memory.grad_bytes += size
        param_bytes = call.params * _param_itemsize(recorder, call.index)
        memory.layers.append(LayerMemory(call.index, call.path, call.class_name, act, grad, param_bytes))
    params = [p for p in module.parameters() if not is_lazy(p)]
    memory.param_bytes = sum(p.numel() * p.element_size() for p in params)
    memory.param_grad_bytes = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    memory.buffer_bytes = sum(b.numel() * b.element_size() for b in module.buffers() if not is_lazy(b))
    return memory


def _param_itemsize(recorder, index: int) -> int:
    """The element size of a call's module's parameters (the first one's; 0 with none)."""
    for p in recorder.modules[index].parameters():
        if not is_lazy(p):
            return p.element_size()
    return 0


#: Words in torch's messages that say an op needed a value, which meta tensors do not have.
_DATA_DEPENDENT = ("cannot be called on meta", "data-dependent", "item()", "is_nonzero", "nonzero",
                   "no data", "without storage")


def explain_meta_failure(failure) -> None:
    """Say so when a meta run failed for want of values, or because the forward made a tensor on a
    fixed device (neither is what the real run would do: no rule of the real run applies)."""
    if failure is None:
        return
    from layerlab.probe.report import Diagnosis

    text = failure.message.lower()
    if any(word in text for word in _DATA_DEPENDENT):
        failure.diagnosis = Diagnosis(
            message=("this step needs tensor values (a Python branch on a tensor, .item(), nonzero or "
                     "boolean indexing), and a meta run has shapes only; every call before it ran"),
            cause="data-dependent", got="meta tensor",
            hint="run without --meta on a small configuration of the same model to check this step",
        )
    elif "meta" in text and "device" in text and ("cpu" in text or "cuda" in text):
        failure.diagnosis = Diagnosis(
            message=("the forward combines the model's tensors (on meta here) with a tensor made on a "
                     "fixed device (device='cpu' or .cpu()/.cuda() in the model's code); it fails the "
                     "same way whenever the model runs on another device"),
            cause="device", got="meta and a fixed device",
            hint="make the tensor on the input's device: torch.ones(..., device=x.device) or .to(x.device)",
        )

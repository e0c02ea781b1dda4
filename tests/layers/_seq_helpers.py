"""Checks shared by the sequence layer tests, for layers with several inputs and nested outputs.

Inputs are given as ``(args, kwargs)``; tensors in them that ``requires_grad`` are cloned for
each side, keeping identity (``query is key`` stays true on both sides: it selects a fused path
in torch's and our multi-head attention). Outputs may be nested tuples (``out, (h_n, c_n)``)
with ``None``s (``need_weights=False``): every tensor is compared, and the backward pass sends
one seeded random ``grad_output`` into every floating output at once.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch
from torch import Tensor, nn
from torch.testing import assert_close

torch.set_num_threads(1)  # the test machine is shared

F64 = torch.float64
Inputs = Tuple[Sequence[Any], Dict[str, Any]]


def randn(*shape: int, seed: int = 0, requires_grad: bool = True, dtype: torch.dtype = F64) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(requires_grad)


def flatten(value: Any) -> List[Any]:
    """Nested tuples/lists → flat list (``None`` kept, so positions line up)."""
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in flatten(v)]
    return [value]


def clone_inputs(inputs: Inputs) -> Tuple[Inputs, List[Tuple[str, Tensor]]]:
    """Fresh leaves for one side; returns the clone and its ``(label, tensor)`` grad leaves."""
    args, kwargs = inputs
    memo: Dict[int, Tensor] = {}
    leaves: List[Tuple[str, Tensor]] = []

    def clone(v: Any, label: str) -> Any:
        if isinstance(v, Tensor):
            if id(v) not in memo:
                t = v.detach().clone()
                if v.requires_grad:
                    t.requires_grad_(True)
                    leaves.append((label, t))
                memo[id(v)] = t
            return memo[id(v)]
        if isinstance(v, tuple):
            return tuple(clone(x, f"{label}[{i}]") for i, x in enumerate(v))
        return v

    new_args = [clone(a, f"arg{i}") for i, a in enumerate(args)]
    new_kwargs = {k: clone(v, k) for k, v in kwargs.items()}
    return (new_args, new_kwargs), leaves


def run_with_grads(fn: Callable, params: Dict[str, Tensor], inputs: Inputs, seed: int = 1):
    """Forward, then backward of every floating output; returns (outputs, input grads, param grads)."""
    for p in params.values():
        p.grad = None
    (args, kwargs), leaves = clone_inputs(inputs)
    out = fn(*args, **kwargs)
    outs = flatten(out)
    g = torch.Generator().manual_seed(seed)
    pairs = [(o, torch.randn(o.shape, generator=g, dtype=o.dtype)) for o in outs
             if isinstance(o, Tensor) and o.requires_grad]
    if pairs:
        torch.autograd.backward([o for o, _ in pairs], [gr for _, gr in pairs])
    in_grads = {label: t.grad for label, t in leaves}
    p_grads = {n: (None if p.grad is None else p.grad.clone()) for n, p in params.items()}
    return [o.detach() if isinstance(o, Tensor) else o for o in outs], in_grads, p_grads


def assert_parity(ours: nn.Module, ref: Callable, inputs: Inputs, *, seed: int = 1,
                  ref_params: Dict[str, Tensor] = None) -> None:
    """Outputs, input gradients and every parameter gradient (by name) agree (float64 defaults)."""
    ours_params = dict(ours.named_parameters()) if isinstance(ours, nn.Module) else {}
    if ref_params is None:
        ref_params = dict(ref.named_parameters()) if isinstance(ref, nn.Module) else {}
    out_a, in_a, p_a = run_with_grads(ours, ours_params, inputs, seed)
    out_b, in_b, p_b = run_with_grads(ref, ref_params, inputs, seed)
    assert len(out_a) == len(out_b), f"number of outputs: ours {len(out_a)}, torch {len(out_b)}"
    for i, (a, b) in enumerate(zip(out_a, out_b)):
        if a is None or b is None:
            assert a is None and b is None, f"output {i}: ours {type(a)}, torch {type(b)}"
            continue
        assert_close(a, b, msg=lambda m, i=i: f"forward output {i}: {m}")
    for label in in_a:
        assert_close(in_a[label], in_b[label], msg=lambda m, label=label: f"gradient of input {label}: {m}")
    if ref_params:
        assert sorted(p_a) == sorted(p_b), f"parameter names differ: {sorted(p_a)} vs {sorted(p_b)}"
        for name in p_a:
            if p_a[name] is None or p_b[name] is None:
                assert p_a[name] is None and p_b[name] is None, f"gradient of {name}: one side has none"
                continue
            assert_close(p_a[name], p_b[name], msg=lambda m, name=name: f"gradient of {name}: {m}")


def assert_gradcheck(module: nn.Module, inputs: Inputs) -> None:
    """float64 gradcheck (fast mode) w.r.t. the grad-requiring inputs and every parameter."""
    module = module.double()
    names = [n for n, p in module.named_parameters() if p.requires_grad]
    params = tuple(p.detach().clone().requires_grad_(True) for n, p in module.named_parameters() if p.requires_grad)
    (args, kwargs), leaves = clone_inputs(inputs)
    leaf_ids = [id(t) for _, t in leaves]

    def f(*flat):
        p_vals, x_vals = flat[: len(names)], flat[len(names):]
        swap = dict(zip(leaf_ids, x_vals))

        def sub(v):
            if isinstance(v, Tensor):
                return swap.get(id(v), v)
            if isinstance(v, tuple):
                return tuple(sub(x) for x in v)
            return v

        out = torch.func.functional_call(module, dict(zip(names, p_vals)), tuple(sub(a) for a in args),
                                         {k: sub(v) for k, v in kwargs.items()})
        return tuple(o for o in flatten(out) if isinstance(o, Tensor) and o.requires_grad)

    torch.autograd.gradcheck(f, (*params, *(t for _, t in leaves)), fast_mode=True, raise_exception=True)


class _Positional(nn.Module):
    """``module(*args, **fixed_kwargs)`` with only positional tensor args, for ``jit.trace``."""

    def __init__(self, module: nn.Module, kwarg_names: Sequence[str], fixed: Dict[str, Any]) -> None:
        super().__init__()
        self.module = module
        self.kwarg_names = list(kwarg_names)
        self.fixed = fixed

    def forward(self, *tensors):
        n = len(tensors) - len(self.kwarg_names)
        kwargs = dict(zip(self.kwarg_names, tensors[n:]), **self.fixed)
        return self.module(*tensors[:n], **kwargs)


def _split_tensor_kwargs(kwargs: Dict[str, Any]):
    tensors = {k: v for k, v in kwargs.items() if isinstance(v, (Tensor, tuple))}
    fixed = {k: v for k, v in kwargs.items() if k not in tensors}
    return tensors, fixed


def assert_traces(module: nn.Module, inputs: Inputs, other: Inputs) -> None:
    """``torch.jit.trace`` on ``inputs`` reproduces eager outputs and gradients on ``other``
    (same shapes, new values), so the trace did not bake in any input value."""
    args, kwargs = inputs
    tkw, fixed = _split_tensor_kwargs(kwargs)
    wrapper = _Positional(module, list(tkw), fixed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates jit.trace; it still works
        (c_args, c_kwargs), _ = clone_inputs(inputs)
        traced = torch.jit.trace(wrapper, (*c_args, *(c_kwargs[k] for k in tkw)), check_trace=False)
    o_args, o_kwargs = other
    flat_other = (list(o_args) + [o_kwargs[k] for k in tkw], {})
    params = dict(module.named_parameters())
    eager = run_with_grads(wrapper, params, flat_other)
    got = run_with_grads(traced, params, flat_other)
    for a, b in zip(got[0], eager[0]):
        if a is not None:
            assert_close(a, b, msg=lambda m: f"traced forward: {m}")
    for k in eager[1]:
        assert_close(got[1][k], eager[1][k], msg=lambda m, k=k: f"traced gradient of {k}: {m}")
    for k in eager[2]:
        assert_close(got[2][k], eager[2][k], msg=lambda m, k=k: f"traced gradient of {k}: {m}")


def assert_compiles(module: nn.Module, inputs: Inputs) -> None:
    """``torch.compile(fullgraph=True)`` captures one graph; forward and backward equal eager.

    ``backend="aot_eager"`` runs dynamo's full-graph capture and AOTAutograd's joint
    forward/backward graph (so fullgraph and autograd are really exercised) without inductor's
    C++ code generation, which would take minutes per layer on a small CPU.
    """
    torch._dynamo.reset()
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    params = dict(module.named_parameters())
    eager = run_with_grads(module, params, inputs)
    got = run_with_grads(compiled, params, inputs)
    for a, b in zip(got[0], eager[0]):
        if a is not None:
            assert_close(a, b, msg=lambda m: f"compiled forward: {m}")
    for k in eager[1]:
        assert_close(got[1][k], eager[1][k], msg=lambda m, k=k: f"compiled gradient of {k}: {m}")
    for k in eager[2]:
        assert_close(got[2][k], eager[2][k], msg=lambda m, k=k: f"compiled gradient of {k}: {m}")

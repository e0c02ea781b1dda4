"""Checks shared by the spatial layer tests: float64 parity (forward and backward, every gradient
by name), gradcheck through ``torch.func.functional_call``, ``torch.jit.trace`` and
``torch.compile``. Each function asserts; the failure message names what differs."""

from __future__ import annotations

import warnings
from typing import Callable, Dict, Optional, Sequence

import torch
from torch import Tensor, nn
from torch.testing import assert_close

torch.set_num_threads(1)  # the test machine is shared; one thread also keeps timings stable

F64 = torch.float64


def randn(*shape: int, seed: int = 0, requires_grad: bool = False) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=F64).requires_grad_(requires_grad)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def assert_parity(ours: nn.Module, ref: nn.Module, x: Tensor, *, param_map: Optional[Dict[str, str]] = None,
                  ref_out: Callable[[Tensor], Tensor] = lambda y: y, seed: int = 1) -> None:
    """Same output, same input gradient and same gradient for every parameter (by name).

    ``param_map`` maps our parameter names to the reference's (identity by default);
    ``ref_out`` turns the reference's output into ours (e.g. a flatten/transpose). Tuple outputs
    (values, indices) are compared element by element; gradients flow through the first one.
    """
    param_map = param_map or {}
    x_ours = x.detach().clone().requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    out_ours, out_ref = ours(x_ours), ref(x_ref)
    if isinstance(out_ref, tuple):
        assert isinstance(out_ours, tuple) and len(out_ours) == len(out_ref)
        for i, (a, b) in enumerate(zip(out_ours, out_ref)):
            assert_close(a, ref_out(b) if i == 0 else b, msg=lambda m, i=i: f"forward output {i}: {m}")
    else:
        assert_close(out_ours, ref_out(out_ref), msg=lambda m: f"forward: {m}")
    y_ours, y_ref = _first(out_ours), ref_out(_first(out_ref))
    grad = torch.randn(y_ours.shape, generator=torch.Generator().manual_seed(seed), dtype=y_ours.dtype)
    y_ours.backward(grad)
    y_ref.backward(grad)
    assert_close(x_ours.grad, x_ref.grad, msg=lambda m: f"input gradient: {m}")
    ref_params = dict(ref.named_parameters())
    ours_params = dict(ours.named_parameters())
    assert len(ours_params) == len(ref_params), (sorted(ours_params), sorted(ref_params))
    for name, p in ours_params.items():
        q = ref_params[param_map.get(name, name)]
        assert_close(p.grad, q.grad, msg=lambda m, name=name: f"gradient of {name}: {m}")


def assert_gradcheck(module: nn.Module, *inputs: Tensor) -> None:
    """float64 gradcheck (fast mode) w.r.t. the inputs and every parameter, via functional_call."""
    module = module.double()
    names = [n for n, p in module.named_parameters() if p.requires_grad]
    params = tuple(dict(module.named_parameters())[n].detach().clone().requires_grad_(True) for n in names)
    xs = tuple(x.detach().clone().to(F64).requires_grad_(True) for x in inputs)

    def f(*args):
        out = torch.func.functional_call(module, dict(zip(names, args[: len(names)])), args[len(names):])
        return _first(out)

    torch.autograd.gradcheck(f, (*params, *xs), fast_mode=True, raise_exception=True)


def _grads(module: nn.Module, fn: Callable, x: Tensor, seed: int = 1):
    module.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    y = _first(fn(x))
    y.backward(torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=y.dtype))
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


def assert_traces(module: nn.Module, x: Tensor, other: Optional[Tensor] = None) -> None:
    """``torch.jit.trace`` gives the eager output and gradients, also on a new input of the same shape."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        # torch 2.13 deprecates jit.trace in favour of torch.compile/export; it still has users
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(module, (x,))
    for inp in (x, other if other is not None else torch.randn_like(x)):
        eager = _grads(module, module, inp)
        got = _grads(module, traced, inp)
        assert_close(got[0], eager[0])
        assert_close(got[1], eager[1])
        assert_close(got[2], eager[2])


def assert_compiles(module: nn.Module, x: Tensor) -> None:
    """``torch.compile(fullgraph=True)`` captures one graph, and forward + backward match eager.

    ``backend="aot_eager"`` runs dynamo's graph capture and AOTAutograd's joint forward/backward
    graph (so fullgraph and autograd are really checked) without inductor's C++ compilation,
    which would take minutes per layer on this CPU.
    """
    torch._dynamo.reset()  # a fresh cache: no recompile limit carried over from other tests
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    eager = _grads(module, module, x)
    got = _grads(module, compiled, x)
    assert_close(got[0], eager[0])
    assert_close(got[1], eager[1])
    assert_close(got[2], eager[2])


def assert_shape_op(layer: nn.Module, x: Tensor, torch_factory: Callable[..., nn.Module],
                    op: str, ignore: Sequence[str] = ()) -> None:
    """``layerlab_shape_op`` names ``op``, and its params (torch's names) build a torch layer whose
    output has the layer's shape."""
    name, params = layer.layerlab_shape_op()
    assert name == op
    kwargs = {k: v for k, v in params.items() if k not in ignore}
    out = _first(torch_factory(**kwargs).to(F64)(x))
    assert out.shape == _first(layer(x)).shape

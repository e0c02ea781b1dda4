"""Leave no trace: the user's model, inputs and process state come back as they were, after every run.

Every command runs the user's own model (or a copy of it) with hooks, seeded RNGs, train mode,
backward passes and repeats. One mechanism hands everything back, on success and on failure
(an exception, a timeout, Ctrl-C)::

    with leave_no_trace(model, inputs):          # every API entry point (see layerlab.target.entry)
        ... run the model as often as the check needs ...

What is saved before the run and put back after it, where the run changed it:

* **the model**: every parameter's and buffer's values (bitwise: BatchNorm's running statistics and
  ``num_batches_tracked``, spectral norm's ``_u``/``_v``, parametrization originals), the very same
  tensor objects under the same names, ``requires_grad``, each submodule's ``training`` flag and
  class (a parametrization swaps it), its module hooks (forward, forward-pre, backward, with kwargs,
  always-called) and the global module hooks, the tensor hooks on parameters and buffers (``None``
  stays ``None``, not an empty dict), the user's ``.grad`` tensors (the same objects with the same
  values) and a Hugging Face config's ``problem_type`` (see :mod:`layerlab.target.buffers`);
* **the inputs**: each tensor's values (a forward that writes into its input in place), its
  ``requires_grad``, ``.grad`` and hooks;
* **the process**: the RNG of torch (CPU, and every CUDA device once CUDA has started), numpy (when
  imported) and Python's ``random``; grad mode, the default dtype and device, torch's intra-op
  threads, deterministic-algorithm, anomaly-detection, autocast and TF32/matmul-precision flags;
  ``os.environ`` (``torch.compile`` sets ``TORCHINDUCTOR_CACHE_DIR``).

What cannot be undone: a module imported during the run stays imported (``torch._dynamo`` after
a compile; un-importing is not supported by Python), and CUDA, once started, stays started.

The cost is one copy of the parameters, buffers, gradients and input tensors (on their device), and
a bitwise comparison after the run: small next to a forward and backward pass.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

import torch
from torch.nn.parameter import is_lazy

from layerlab.target.buffers import SavedBuffers, put_back

__all__ = ["leave_no_trace", "Snapshot", "ProcessState", "tensors_in"]

#: The per-module hook dicts torch keeps (every one an OrderedDict on every module).
_MODULE_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
                 "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
                 "_backward_pre_hooks", "_parameters", "_buffers", "_modules")
#: torch.nn.modules.module's global hooks (``register_module_forward_hook``).
_GLOBAL_DICTS = ("_global_forward_hooks", "_global_forward_hooks_with_kwargs", "_global_forward_hooks_always_called",
                 "_global_forward_pre_hooks", "_global_backward_hooks", "_global_backward_pre_hooks",
                 "_global_buffer_registration_hooks", "_global_module_registration_hooks",
                 "_global_parameter_registration_hooks")


@contextlib.contextmanager
def leave_no_trace(module: Optional[torch.nn.Module] = None, values: Iterable[Any] = ()) -> Iterator["Snapshot"]:
    """Run the body; put the model, the tensors among ``values`` (nested tuples, lists, dicts,
    dataclasses) and the process state back as they were, also when the body raises."""
    snapshot = Snapshot(module, values)
    try:
        yield snapshot
    finally:
        snapshot.restore()


def tensors_in(value: Any, found: Optional[Dict[int, torch.Tensor]] = None, depth: int = 0) -> Dict[int, torch.Tensor]:
    """Every tensor in a nested tuple/list/dict/dataclass, by ``id`` (one tensor passed twice once)."""
    import dataclasses

    found = {} if found is None else found
    if depth > 50:  # a self-referencing structure: what is below this depth is not the user's batch
        return found
    if isinstance(value, torch.Tensor):
        found.setdefault(id(value), value)
    elif isinstance(value, dict):
        for v in value.values():
            tensors_in(v, found, depth + 1)
    elif isinstance(value, (list, tuple)):
        for v in value:
            tensors_in(v, found, depth + 1)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            tensors_in(getattr(value, f.name, None), found, depth + 1)
    return found


def _savable(t: torch.Tensor) -> bool:
    """A dense tensor with values to copy (a lazy, meta, inference or sparse one has none to compare)."""
    return (not is_lazy(t) and not t.is_meta and not t.is_inference() and t.layout == torch.strided
            and not getattr(t, "is_nested", False))


class _TensorState:
    """One tensor's values, ``requires_grad``, ``.grad`` (object and values) and hooks."""

    __slots__ = ("t", "values", "version", "requires_grad", "grad", "grad_values", "grad_version", "hooks",
                 "post_hooks")

    def __init__(self, t: torch.Tensor, values: bool = True) -> None:
        self.t = t
        self.values = t.detach().clone() if values and _savable(t) else None
        self.version = t._version
        self.requires_grad = t.requires_grad
        grad = t.grad if t.is_leaf else None
        self.grad = grad
        self.grad_values = grad.detach().clone() if grad is not None and _savable(grad) else None
        self.grad_version = grad._version if grad is not None else 0
        self.hooks = _copy(t._backward_hooks)
        self.post_hooks = _copy(getattr(t, "_post_accumulate_grad_hooks", None))

    def restore(self) -> None:
        t = self.t
        if self.values is not None and not _bitwise_equal(t, self.values):
            # only where the values differ: a write bumps the version counter, and an input that is the
            # output of the user's own graph must keep its version for their backward
            put_back(t, self.version, self.values)
        if t.is_leaf:
            if t.grad is not self.grad:
                t.grad = self.grad
            if self.grad is not None and self.grad_values is not None:
                put_back(self.grad, self.grad_version, self.grad_values)
            if t.requires_grad != self.requires_grad:
                t.requires_grad_(self.requires_grad)
        if not _same(t._backward_hooks, self.hooks):
            t._backward_hooks = _copy(self.hooks)
        if hasattr(t, "_post_accumulate_grad_hooks") and not _same(t._post_accumulate_grad_hooks, self.post_hooks):
            t._post_accumulate_grad_hooks = _copy(self.post_hooks)


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaN equals the same NaN, -0.0 differs from 0.0), as the guarantee reads."""
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    try:
        return bool(torch.equal(a.detach().contiguous().view(-1).view(torch.uint8),
                                b.detach().contiguous().view(-1).view(torch.uint8)))
    except (RuntimeError, TypeError):  # a dtype without a byte view
        return bool(torch.equal(a, b))


def _copy(d: Any) -> Any:
    return None if d is None else type(d)(d)


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return list(a.items()) == list(b.items())


class Snapshot:
    """The state of a model, its inputs and the process; :meth:`restore` puts it back."""

    def __init__(self, module: Optional[torch.nn.Module] = None, values: Iterable[Any] = ()) -> None:
        self.process = ProcessState()
        self.modules: List[Tuple[torch.nn.Module, type, bool, Dict[str, Any]]] = []
        self.buffers = None
        seen: Dict[int, _TensorState] = {}
        if isinstance(module, torch.nn.Module):
            subs = _all_modules(module)
            self.modules = [(m, type(m), m.training, {name: dict(getattr(m, name)) for name in _MODULE_DICTS
                                                     if isinstance(getattr(m, name, None), dict)}) for m in subs]
            self.buffers = SavedBuffers(subs)  # buffers' values, and a Hugging Face config's choices
            for m in subs:
                for p in m._parameters.values():
                    if p is not None and id(p) not in seen:
                        seen[id(p)] = _TensorState(p)
                for b in m._buffers.values():
                    if b is not None and id(b) not in seen:
                        seen[id(b)] = _TensorState(b, values=False)  # SavedBuffers holds their values
        for value in values:
            for key, t in tensors_in(value).items():
                if key not in seen:
                    seen[key] = _TensorState(t)
        self.tensors = list(seen.values())

    def restore(self) -> None:
        """Put back what the run changed (nothing is written where nothing changed)."""
        for m, cls, training, dicts in self.modules:
            if type(m) is not cls:
                m.__class__ = cls
            if m.training is not training:
                m.training = training
            for name, saved in dicts.items():
                current = getattr(m, name)
                if len(current) != len(saved) or any(current.get(k, _MISSING) is not v for k, v in saved.items()):
                    current.clear()
                    current.update(saved)
        if self.buffers is not None:
            self.buffers.restore()
        with torch.no_grad():
            for state in self.tensors:
                state.restore()
        self.process.restore()


_MISSING = object()


def _all_modules(module: torch.nn.Module) -> List[torch.nn.Module]:
    """Every submodule, walked without recursion (a model nested thousands deep has no recursion limit
    here), each once."""
    out, seen, stack = [], set(), [module]
    while stack:
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        out.append(m)
        stack.extend(reversed([c for c in m._modules.values() if c is not None]))
    return out


class ProcessState:
    """The process-wide state a run may change: RNGs, torch's global flags, ``os.environ``, global hooks."""

    def __init__(self) -> None:
        import torch.nn.modules.module as module_globals

        self.rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        numpy = sys.modules.get("numpy")
        self.numpy_rng = numpy.random.get_state() if numpy is not None else None
        self.py_rng = random.getstate()
        self.flags = {name: get() for name, (get, _) in _FLAGS.items()}
        self.environ = dict(os.environ)
        self.global_hooks = {name: dict(getattr(module_globals, name)) for name in _GLOBAL_DICTS
                             if isinstance(getattr(module_globals, name, None), dict)}
        self.full_backward = getattr(module_globals, "_global_is_full_backward_hook", None)

    def restore(self) -> None:
        import torch.nn.modules.module as module_globals

        torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        numpy = sys.modules.get("numpy")
        if self.numpy_rng is not None and numpy is not None:
            numpy.random.set_state(self.numpy_rng)
        random.setstate(self.py_rng)
        for name, (get, put) in _FLAGS.items():
            if get() != self.flags[name]:
                put(self.flags[name])
        if dict(os.environ) != self.environ:
            for key in [k for k in os.environ if k not in self.environ]:
                del os.environ[key]
            for key, value in self.environ.items():
                if os.environ.get(key) != value:
                    os.environ[key] = value
        for name, saved in self.global_hooks.items():
            current = getattr(module_globals, name)
            if list(current.items()) != list(saved.items()):
                current.clear()
                current.update(saved)
        if getattr(module_globals, "_global_is_full_backward_hook", None) != self.full_backward:
            module_globals._global_is_full_backward_hook = self.full_backward


def _autocast(device: str):
    return (lambda: (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)),
            lambda v: (torch.set_autocast_enabled(device, v[0]), torch.set_autocast_dtype(device, v[1])))


def _cuda_flag(holder: Any, name: str):
    return lambda: getattr(holder, name), lambda v: setattr(holder, name, v)


#: name -> (read, write) of each global flag a run may flip.
_FLAGS = {
    "grad_enabled": (torch.is_grad_enabled, torch.set_grad_enabled),
    "default_dtype": (torch.get_default_dtype, torch.set_default_dtype),
    "default_device": (torch.get_default_device, torch.set_default_device),
    "num_threads": (torch.get_num_threads, torch.set_num_threads),
    "deterministic": (lambda: (torch.are_deterministic_algorithms_enabled(),
                               torch.is_deterministic_algorithms_warn_only_enabled()),
                      lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
    "anomaly": (lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
                lambda v: torch.set_anomaly_enabled(v[0], v[1])),
    "autocast_cpu": _autocast("cpu"),
    "autocast_cuda": _autocast("cuda"),
    "autocast_cache": (torch.is_autocast_cache_enabled, torch.set_autocast_cache_enabled),
    "matmul_precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    "cudnn_benchmark": _cuda_flag(torch.backends.cudnn, "benchmark"),
    "cudnn_deterministic": _cuda_flag(torch.backends.cudnn, "deterministic"),
    "cudnn_tf32": _cuda_flag(torch.backends.cudnn, "allow_tf32"),
    "cuda_matmul_tf32": _cuda_flag(torch.backends.cuda.matmul, "allow_tf32"),
}

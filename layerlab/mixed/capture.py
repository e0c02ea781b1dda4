"""What one run of precision-check keeps of each module call: a bounded sample of its values.

Comparing a half-precision run with float32 module by module needs both runs' values at the
same places. Keeping every module's whole output twice would double the model's activation
memory (and more: a module's input is mostly the previous one's output, kept again), so a call
keeps, per floating tensor, at most :data:`MAX_SAMPLES` elements at fixed positions — drawn from
a generator seeded by the seed and the tensor's size, so every run keeps the same positions of
the same tensor (``index_select`` on a contiguous tensor, ``torch.take`` otherwise: no copy) —
plus whole-tensor facts computed on the spot: whether anything is not finite and, for the
float32 run's outputs, ``max |x|`` (float16 overflow). A tensor seen again (a module's input is mostly the previous module's output) is
measured once.

Bounds: :data:`MAX_SAMPLES` values per tensor, :data:`MAX_TENSORS` tensors per side (inputs,
outputs, output gradients) per call, :data:`MAX_CALLS` calls per run; so at most
``MAX_CALLS · 3 · MAX_TENSORS · MAX_SAMPLES · 4`` bytes per run (a 20-module model: about 4 MiB).
Calls past :data:`MAX_CALLS` are counted, not kept.

The gradient reaching each output is read by a tensor hook (not ``register_full_backward_hook``,
which wraps outputs in extra autograd nodes).

The op trace of the same run (:class:`~layerlab.probe.ops.OpTrace`) is paused while these hooks
compute, so their own ``take``/``norm`` calls are never recorded as the model's ops.
"""

from __future__ import annotations

import functools
import math
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch

from layerlab.probe.hooks import ProbeBug, _version, dtype_name, flatten
from layerlab.probe.stats import abs_max

MAX_SAMPLES = 4096
MAX_TENSORS = 4
MAX_CALLS = 4096

#: (seed, numel, device) → the positions kept of such a tensor: the same in every run, drawn once
_POSITIONS: Dict[tuple, torch.Tensor] = {}

#: a module call: (qualified path, which call of it: 1, 2, …)
Key = Tuple[str, int]


@dataclass
class Seen:
    """One tensor at one place in one run.

    Attributes:
        sample: float32 copy of at most MAX_SAMPLES elements (the same positions in every run).
        numel, dtype: of the whole tensor.
        amax: ``max |x|`` over the finite elements of the whole tensor (a ``-inf`` mask is not a
            large value); measured for module outputs of the float32 run only, else ``None``.
        finite: every element finite.
    """

    sample: torch.Tensor
    numel: int
    dtype: str
    amax: Optional[float]
    finite: bool


@dataclass
class CallSeen:
    """One module call of one run. ``order``: the order calls started in; ``parent``: the calling one's key."""

    key: Key
    class_name: str
    depth: int
    order: int
    parent: Optional[Key]
    library: bool
    inputs: List[Seen] = field(default_factory=list)
    outputs: List[Seen] = field(default_factory=list)
    grads: Dict[int, Seen] = field(default_factory=dict)   # output slot → the gradient that reached it


def all_finite(t: torch.Tensor) -> bool:
    """Every element finite? A sum is (one pass, 5× cheaper than ``isfinite(t).all()``) whenever
    every element is; when it is not, ``aminmax`` tells an inf/NaN element from a sum past the
    dtype's range."""
    return math.isfinite(float(t.sum())) or math.isfinite(abs_max(t))


def finite_amax(t: torch.Tensor) -> float:
    """``max |x|`` over the finite elements (0 when there are none)."""
    a = t.detach().abs().float()
    return float(torch.where(torch.isfinite(a), a, 0.0).max()) if a.numel() else 0.0


#: ``torch.finfo(torch.float32).max``: the fill of masks written as ``torch.finfo(x.dtype).min``
#: (Hugging Face's attention masks and position biases, torch's own), which follows the run's dtype
_FLOAT32_FILL = torch.finfo(torch.float32).max


def measured_amax(t: torch.Tensor) -> Tuple[float, bool]:
    """``(max |x|, finite)`` of a float32-run tensor as float16 would meet it: over the finite
    elements, and leaving out ±``finfo(float32).max``. That value is a mask fill taken from
    ``torch.finfo(dtype)``: in a float16 run it is ±65504, never inf (T5's
    ``where(causal_mask, position_bias, finfo.min)`` was called a float16 overflow). Only a tensor
    that holds one pays for the second pass."""
    amax = abs_max(t)
    finite = math.isfinite(amax)  # inf or NaN when any element is
    if not finite:
        amax = finite_amax(t)
    if amax == _FLOAT32_FILL and t.dtype == torch.float32:
        a = t.detach().abs()
        amax = float(torch.where(torch.isfinite(a) & (a < _FLOAT32_FILL), a, 0.0).max())
    return amax, finite


def _root(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose memory and version counter a view shares (itself when not a view)."""
    return t if t._base is None else t._base


def _floating(value: Any) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):  # the common case, without flattening anything
        leaves = (value,)
    elif isinstance(value, tuple) and all(isinstance(v, torch.Tensor) for v in value):
        leaves = value  # a module's positional arguments, mostly
    else:
        leaves = [t for _, t in flatten(value)]
    found = [t for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()
             and not t.is_nested and t.numel() > 0]
    return found[:MAX_TENSORS]


class Capture:
    """Hooks on every module of one run's copy of the model.

    Args:
        model: the copy being run.
        seed: seeds the sample positions (with the tensor's size: the same in every run).
        trace: the op trace of the same run, paused while the hooks work (or ``None``).
        measure: note ``max |x|`` of every output (the float32 run: it says what float16 overflows);
            a half run only needs to know whether a tensor is finite.
        named_modules: ``list(model.named_modules())`` when the caller has it.
        known: :meth:`seen` of an earlier run on the same inputs: a tensor of it that is still the same
            (the model's own inputs, unchanged: autocast does not cast them) is not looked at again.
    """

    def __init__(self, model: torch.nn.Module, *, seed: int, trace: Any = None, measure: bool = True,
                 named_modules: Optional[List[Tuple[str, torch.nn.Module]]] = None,
                 known: Optional[Dict[int, tuple]] = None) -> None:
        from layerlab.probe.ops import library_class

        self.model = model
        self.seed = seed
        self.measure = measure
        self._named_modules = named_modules
        self._memo: Dict[int, tuple] = dict(known) if known else {}  # id → (weakref, _version, Seen)
        self._memo_data: Dict[tuple, tuple] = {}  # (data_ptr, numel, dtype) of a contiguous tensor → as _memo
        self.trace = trace
        self.calls: Dict[Key, CallSeen] = {}
        self.dropped = 0
        self._library = library_class
        self._names: Dict[int, Tuple[str, int, str, bool]] = {}  # id → path, depth, class, library
        self._counts: Dict[int, int] = {}
        self._stack: List[Key] = []
        self._handles: list = []
        self._grad_handles: list = []

    # -- installation ----------------------------------------------------------------------------
    def __enter__(self) -> "Capture":
        named = self._named_modules if self._named_modules is not None else self.model.named_modules()
        for path, module in named:
            self._names[id(module)] = (path, path.count(".") + 1 if path else 0, type(module).__name__,
                                       self._library(type(module)))
            self._handles.append(module.register_forward_pre_hook(self._pre))
            self._handles.append(module.register_forward_hook(self._post))
        return self

    def __exit__(self, *exc: Any) -> None:
        """Module hooks off; the gradient hooks stay until :meth:`remove` (after the backward)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def remove(self) -> None:
        for handle in self._handles + self._grad_handles:
            handle.remove()
        self._handles.clear()
        self._grad_handles.clear()

    def seen(self) -> Dict[int, tuple]:
        """The tensors looked at, by ``id``, as a later run's ``known`` (weak references: a tensor
        that has died since, or whose ``id`` was reused, is never taken for another)."""
        return self._memo

    # -- sampling --------------------------------------------------------------------------------
    def _index(self, numel: int, device: torch.device) -> Optional[torch.Tensor]:
        """The positions kept of a tensor of ``numel`` elements (``None``: all of them). They depend
        only on the seed and the size, so every run keeps the same positions of the same tensor."""
        if numel <= MAX_SAMPLES:
            return None
        key = (self.seed, numel, device)
        found = _POSITIONS.get(key)
        if found is None:
            if len(_POSITIONS) >= 256:  # bounded: a few hundred sizes × 32 KiB
                _POSITIONS.clear()
            gen = torch.Generator().manual_seed((self.seed * 1_000_003 + numel) & (2**63 - 1))
            found = _POSITIONS[key] = torch.randint(numel, (MAX_SAMPLES,), generator=gen).to(device)
        return found

    def _see(self, t: torch.Tensor, grad: bool = False, measure: bool = False) -> Seen:
        """Sample ``t`` and say whether it is finite; ``measure``: also its ``max |x|`` (only the
        float32 run's outputs need it). A tensor seen before is looked at once: the same object
        (a module's input is mostly the previous one's output), or a contiguous view of the same
        elements (``Flatten``'s output and its gradient), alive and with the same ``_version``.

        The version counter misses writes through another tensor on the same memory (``.data``,
        ``from_numpy``, inference tensors, which have none): a look at other memory-sharing tensor is
        reused only where the view shares its base with the tensor seen (so shares its counter) and
        the kept sample reads the same now (every element up to MAX_SAMPLES; beyond, the sampled
        positions). The same object is trusted on its version, as it always was."""
        contiguous = t.is_contiguous()
        data_key = (t.data_ptr(), t.numel(), t.dtype) if contiguous and not t.is_neg() else None
        memo = self._memo.get(id(t)) if not grad else None
        if (memo is None or memo[0]() is not t) and data_key is not None:  # an id outlives its tensor
            memo = self._memo_data.get(data_key)
        if memo is not None:
            seen_t = memo[0]()
            same = seen_t is t
            alias = (not same and seen_t is not None and data_key is not None and seen_t.data_ptr() == data_key[0]
                     and _root(seen_t) is _root(t))
            # the same object is trusted on its version alone (a module's input is the previous
            # output: the common case, kept cheap); another view of the memory is read again too
            if (same or alias) and memo[1] == _version(t) == _version(seen_t) \
                    and (memo[2].amax is not None or not measure) and (same or self._reads_same(t, memo[2])):
                return memo[2]
        d = t.detach()
        numel = d.numel()
        sample = self._kept(d, contiguous).float()
        if sample.data_ptr() == d.data_ptr():
            sample = sample.clone()  # a view of the tensor: keep a copy
        if measure:
            amax, finite = measured_amax(d)
        else:
            amax, finite = None, all_finite(d)
        seen = Seen(sample=sample, numel=numel, dtype=dtype_name(d.dtype), amax=amax, finite=finite)
        entry = (weakref.ref(t), _version(t), seen)
        if not grad:
            self._memo[id(t)] = entry
        if data_key is not None:
            self._memo_data[data_key] = entry
        return seen

    def _reads_same(self, t: torch.Tensor, seen: Seen) -> bool:
        """Does ``t`` still hold what :class:`Seen` kept of it (NaN never compares equal: looked at again)?"""
        d = t.detach()
        if d.numel() != seen.numel or dtype_name(d.dtype) != seen.dtype:
            return False
        return torch.equal(self._kept(d, d.is_contiguous()).float(), seen.sample)

    def _kept(self, d: torch.Tensor, contiguous: bool) -> torch.Tensor:
        """The elements of ``d`` a :class:`Seen` keeps, flat, in ``d``'s dtype (a view where it can be)."""
        numel = d.numel()
        if numel <= MAX_SAMPLES:
            return d.reshape(-1)
        idx = self._index(numel, d.device)
        return d.view(-1).index_select(0, idx) if contiguous else torch.take(d, idx)

    # -- hooks -----------------------------------------------------------------------------------
    def _pre(self, module: torch.nn.Module, args: tuple) -> None:
        trace = self.trace
        if trace is not None:
            trace.paused += 1
        try:
            path, depth, class_name, library = self._names[id(module)]
            count = self._counts[id(module)] = self._counts.get(id(module), 0) + 1
            key = (path, count)
            parent = self._stack[-1] if self._stack else None
            self._stack.append(key)
            if len(self.calls) >= MAX_CALLS:
                self.dropped += 1
                return
            seen = CallSeen(key=key, class_name=class_name, depth=depth, order=len(self.calls),
                            parent=parent, library=library)
            seen.inputs = [self._see(t) for t in _floating(args)]  # detached: no graph, no no_grad needed
            self.calls[key] = seen
        except Exception as exc:  # pragma: no cover - a bug in layerlab, not in the model
            raise ProbeBug(exc) from exc
        finally:
            if trace is not None:
                trace.paused -= 1

    def _post(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        trace = self.trace
        if trace is not None:
            trace.paused += 1
        try:
            key = self._stack.pop()
            while self._names[id(module)][0] != key[0] and self._stack:  # a child raised, this caught it
                key = self._stack.pop()
            seen = self.calls.get(key)
            if seen is None:
                return
            outs = _floating(output)
            seen.outputs = [self._see(t, measure=self.measure) for t in outs]
            for i, t in enumerate(outs):
                if t.requires_grad:
                    self._grad_handles.append(t.register_hook(functools.partial(self._on_grad, key, i)))
        except Exception as exc:  # pragma: no cover - a bug in layerlab, not in the model
            raise ProbeBug(exc) from exc
        finally:
            if trace is not None:
                trace.paused -= 1

    def _on_grad(self, key: Key, slot: int, grad: torch.Tensor) -> None:
        try:
            if grad is not None and grad.is_floating_point() and not grad.is_nested:
                self.calls[key].grads[slot] = self._see(grad, grad=True)
        except Exception as exc:  # pragma: no cover - a bug in layerlab, not in the model
            raise ProbeBug(exc) from exc

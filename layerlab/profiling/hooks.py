"""Per-module-call timing of one forward + backward step, from module hooks and autograd-node hooks.

Rows are inspect's: one per module call, named by the module's qualified path and call number,
nested by who called whom. Why not :class:`layerlab.probe.hooks.Recorder`? Its hooks describe every
input and output (flattening, slot lookups, weak references, gradient hooks on every tensor):
right for inspect, but that work would be inside the times measured here. These hooks read a
clock and a counter and nothing else.

Forward: a pre-hook and a post-hook per module read the clock (inclusive time) and
``torch.autograd._get_sequence_nr()``: every autograd node created during the call has a sequence
number in ``[seq0, seq1)``, which is how backward work is attributed.

Backward: after the forward, the autograd graph is walked from the outputs and every node gets a
pre-hook and a post-hook that read the clock. A node belongs to the innermost call whose sequence
range holds its number (children's ranges lie inside their parents'); a parameter's
``AccumulateGrad`` node belongs to the module that registered the parameter (or its nearest
called ancestor, for a parameter used functionally). A call's self backward time is the sum of its
nodes' times; what the engine spends between nodes is not attributed to any row.

Clocks: ``time.perf_counter`` on CPU (wall time); CUDA events on a CUDA device, read after one
synchronise at the end of the step. In measure mode the same hooks read a
:class:`torch.utils.flop_counter.FlopCounterMode`'s running total instead (FLOPs per call and per
node) and a saved-tensors hook attributes the bytes autograd keeps for backward to the call that
saved them.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Dict, List, Optional

import torch

__all__ = ["WallClock", "CudaClock", "Call", "StepProbe"]


class WallClock:
    """``time.perf_counter``: wall time, the right clock on CPU."""

    name = "wall time (time.perf_counter)"

    def now(self) -> float:
        return time.perf_counter()

    @staticmethod
    def seconds(a: Any, b: Any) -> float:
        return b - a

    def sync(self) -> None:
        pass


class CudaClock:
    """CUDA events recorded on the current stream; :meth:`sync` before reading them."""

    name = "CUDA events (torch.cuda.Event, synchronised per step)"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def now(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def seconds(a: Any, b: Any) -> float:
        return a.elapsed_time(b) / 1e3

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)


class Call:
    """One module call of one step (hook bookkeeping; rows are built from these)."""

    __slots__ = ("key", "parent", "seq0", "seq1", "t0", "t1", "f0", "f1", "out_bytes")

    def __init__(self, key: tuple, parent: Optional[int]) -> None:
        self.key = key
        self.parent = parent
        self.seq0 = self.seq1 = 0
        self.t0 = self.t1 = None
        self.f0 = self.f1 = 0
        self.out_bytes = 0


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_tensor_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    return 0


class StepProbe:
    """Hooks for one step at a time: :meth:`install`, run forward, :meth:`attach_backward`, run
    backward, :meth:`remove`, then read :attr:`calls`, :attr:`node_owner` and the node times.

    Args:
        root: the model.
        clock: :class:`WallClock` or :class:`CudaClock`.
        flops: a FlopCounterMode to read (measure mode: FLOPs and saved bytes, no times).
    """

    def __init__(self, root: torch.nn.Module, clock: Any, flops: Any = None) -> None:
        self.root = root
        self.clock = clock
        self.flops = flops
        self.measure = flops is not None
        self.paths: Dict[int, str] = {}
        for path, module in root.named_modules(remove_duplicate=False):
            self.paths.setdefault(id(module), path)
        self.param_owner: Dict[int, str] = {}
        for path, module in root.named_modules():
            for p in module.parameters(recurse=False):
                self.param_owner.setdefault(id(p), path)
        self._handles: list = []
        self.begin()

    # -- per step --------------------------------------------------------------------------------
    def begin(self) -> None:
        self.calls: List[Call] = []
        self.stack: List[int] = []
        self.counts: Dict[str, int] = {}
        self.node_owner: List[int] = []
        self.node_t0: List[Any] = []
        self.node_t1: List[Any] = []
        self.node_f: List[int] = []
        self.saved_bytes: Dict[int, int] = {}
        self._saved_seen: set = set()
        self._node_running: Optional[int] = None
        self.in_backward = False
        self.replayed = 0

    def install(self) -> None:
        for module in self.root.modules():
            self._handles.append(module.register_forward_pre_hook(self._pre))
            self._handles.append(module.register_forward_hook(self._post))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    # -- forward hooks ---------------------------------------------------------------------------
    def _pre(self, module: torch.nn.Module, args: tuple) -> None:
        if self.in_backward:  # activation checkpointing re-running a forward: not a call of the step
            self.replayed += 1
            return
        path = self.paths.get(id(module), type(module).__name__)
        n = self.counts[path] = self.counts.get(path, 0) + 1
        call = Call((path, n), self.stack[-1] if self.stack else None)
        self.stack.append(len(self.calls))
        self.calls.append(call)
        if self.measure:
            call.f0 = self.flops.get_total_flops()
        call.seq0 = torch.autograd._get_sequence_nr()
        call.t0 = self.clock.now()

    def _post(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        if self.in_backward:
            return
        t1 = self.clock.now()
        index = self.stack.pop()
        while self.calls[index].key[0] != self.paths.get(id(module), type(module).__name__) and self.stack:
            index = self.stack.pop()  # a child raised and this module caught it
        call = self.calls[index]
        call.t1 = t1
        call.seq1 = torch.autograd._get_sequence_nr()
        if self.measure:
            call.f1 = self.flops.get_total_flops()
            call.out_bytes = _tensor_bytes(output)

    # -- saved tensors (measure mode) ------------------------------------------------------------
    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """Attribute the storage autograd saves to the innermost running call (once per storage)."""
        if not self.stack:
            return t
        try:
            storage = t.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
        except Exception:  # tensors without storage (sparse, nested, fake)
            key, size = id(t), _tensor_bytes(t)
        if key in self._static or key in self._saved_seen:
            return t
        self._saved_seen.add(key)
        owner = self.stack[-1]
        self.saved_bytes[owner] = self.saved_bytes.get(owner, 0) + size
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def saved_tensors(self):
        """The ``saved_tensors_hooks`` context that fills :attr:`saved_bytes` (parameters and
        buffers are not activations and are left out)."""
        self._static = set()
        for t in (*self.root.parameters(), *self.root.buffers()):
            try:
                self._static.add(t.untyped_storage().data_ptr())
            except Exception:
                pass
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    # -- backward --------------------------------------------------------------------------------
    def attach_backward(self, outputs: List[torch.Tensor]) -> int:
        """Hook every autograd node of this step's graph; return how many were hooked.

        From here on the step is in backward: a module call now is a recomputation
        (``torch.utils.checkpoint``) that runs inside the autograd node that unpacked a checkpointed
        tensor; it gets no row (it would read as a second forward call), its time and FLOPs stay in
        that node's, and :attr:`replayed` counts it."""
        self.in_backward = True
        if not self.calls:
            return 0
        root = self.calls[0]
        base, end = root.seq0, root.seq1
        owner_of_seq: List[int] = [0] * max(end - base, 0)
        for i, call in enumerate(self.calls):  # parents first: children overwrite their ranges
            a, b = call.seq0 - base, call.seq1 - base
            if b > a:
                owner_of_seq[a:b] = [i] * (b - a)
        first_call: Dict[str, int] = {}
        for i, call in enumerate(self.calls):
            first_call.setdefault(call.key[0], i)
        stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
        seen = set()
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            variable = getattr(node, "variable", None)
            if variable is not None:  # AccumulateGrad of a leaf
                owner = self._param_call(id(variable), first_call)
            else:
                seq = node._sequence_nr() - base
                owner = owner_of_seq[seq] if 0 <= seq < len(owner_of_seq) else None
                stack.extend(f for f, _ in node.next_functions)
            if owner is None:
                continue
            j = len(self.node_owner)
            self.node_owner.append(owner)
            self.node_t0.append(None)
            self.node_t1.append(None)
            self.node_f.append(0)
            node.register_prehook(functools.partial(self._node_pre, j))
            node.register_hook(functools.partial(self._node_post, j))
        return len(self.node_owner)

    def param_bytes_per_call(self) -> Dict[int, int]:
        """``{call index: bytes}`` of the parameters each call holds, so that the rows add up to the
        model's parameters: each tensor once (a tied weight is one tensor, on the module that
        registered it first), on the first call of the module that registered it, or of its nearest
        called ancestor when that module never ran itself (``nn.MultiheadAttention`` uses its
        ``out_proj`` through ``F.linear``: a quarter of its weights would otherwise vanish)."""
        first_call: Dict[str, int] = {}
        for i, call in enumerate(self.calls):
            first_call.setdefault(call.key[0], i)
        sizes: Dict[int, int] = {}
        if not first_call:
            return sizes
        for p in self.root.parameters():  # unique tensors: tied weights once
            owner = self._param_call(id(p), first_call)
            if owner is not None:
                sizes[owner] = sizes.get(owner, 0) + p.numel() * p.element_size()
        return sizes

    def _param_call(self, pid: int, first_call: Dict[str, int]) -> Optional[int]:
        path = self.param_owner.get(pid)
        if path is None:
            return None  # an input that requires grad: not a module's work
        while True:
            if path in first_call:
                return first_call[path]
            if not path:
                return 0
            path = path.rsplit(".", 1)[0] if "." in path else ""

    def _node_pre(self, j: int, grad_outputs: Any) -> None:
        if self.measure:
            self.node_f[j] = self.flops.get_total_flops()
            self._node_running = j
        else:
            self.node_t0[j] = self.clock.now()

    def _node_post(self, j: int, grad_inputs: Any, grad_outputs: Any) -> None:
        if self.measure:
            self.node_f[j] = self.flops.get_total_flops() - self.node_f[j]
            self._node_running = None
        else:
            self.node_t1[j] = self.clock.now()

    def current_call(self) -> Optional[int]:
        """Measure mode: the call whose work is running now (the innermost module call in forward,
        the owner of the running autograd node in backward), ``None`` outside every call."""
        if self._node_running is not None:
            return self.node_owner[self._node_running]
        return self.stack[-1] if self.stack else None

    # -- results ---------------------------------------------------------------------------------
    def times(self) -> Dict[tuple, tuple]:
        """``{(path, call): (fwd_self, bwd_self, fwd_incl, bwd_incl)}`` in seconds (after :meth:`clock.sync`)."""
        sec = self.clock.seconds
        n = len(self.calls)
        fwd_incl = [sec(c.t0, c.t1) if c.t1 is not None else 0.0 for c in self.calls]
        bwd_self = [0.0] * n
        for j, owner in enumerate(self.node_owner):
            a, b = self.node_t0[j], self.node_t1[j]
            if a is not None and b is not None:
                bwd_self[owner] += sec(a, b)
        return _nest(self.calls, fwd_incl, bwd_self)

    def counts_per_call(self) -> Dict[tuple, tuple]:
        """Measure mode: ``{(path, call): (fwd_flops_self, bwd_flops_self, saved_bytes_self, out_bytes)}``."""
        n = len(self.calls)
        f_incl = [float(c.f1 - c.f0) for c in self.calls]
        b_self = [0.0] * n
        for j, owner in enumerate(self.node_owner):
            b_self[owner] += self.node_f[j]
        nested = _nest(self.calls, f_incl, b_self)
        return {c.key: (nested[c.key][0], b_self[i], self.saved_bytes.get(i, 0), c.out_bytes)
                for i, c in enumerate(self.calls)}


def _nest(calls: List[Call], fwd_incl: List[float], bwd_self: List[float]) -> Dict[tuple, tuple]:
    """Self forward = inclusive − children's inclusive; inclusive backward = self + children's."""
    n = len(calls)
    child_fwd = [0.0] * n
    bwd_incl = list(bwd_self)
    for i in range(n - 1, -1, -1):  # children come after their parents
        p = calls[i].parent
        if p is not None:
            child_fwd[p] += fwd_incl[i]
            bwd_incl[p] += bwd_incl[i]
    return {c.key: (max(fwd_incl[i] - child_fwd[i], 0.0), bwd_self[i], fwd_incl[i], bwd_incl[i])
            for i, c in enumerate(calls)}

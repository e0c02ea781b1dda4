"""Per-call forward records from module hooks, and per-tensor gradient norms from tensor hooks.

:class:`Recorder` puts a forward pre-hook and a forward hook (both ``with_kwargs=True``) on every
submodule. The pre-hook opens a :class:`CallRecord` (a row per call: a module called twice, or a
cell run in a loop, gets one row per call) and describes the inputs; the forward hook describes
the outputs and closes the record. A call whose forward raises is never closed, so after an
exception the innermost open call is the one that failed.

Each distinct tensor (identity plus ``_version``, so an in-place op makes a new one) is a *slot*:
its statistics are computed once, and one tensor hook records the norm of the gradient that
reaches it. A ``Sequential``'s output is its last child's output, and a module's input is mostly
the previous module's output, so most inputs cost nothing.

Two kinds of module need care. A lazy module (``nn.LazyLinear``) has no parameter sizes before
its first forward: its parameters count as 0 when the hooks go on, and the call's counts are taken
again when it returns (its own pre-hook has materialised them by then). A nested tensor (the
fast path of ``nn.TransformerEncoder`` in eval mode with a padding mask) has no ``.shape``: its
ragged dimensions are described as ``None`` and ``TensorInfo.nested`` is set.

Nothing here keeps a tensor alive after the call that saw it: slots hold weak references, and
the inputs of running calls are released when the call returns. Gradient hooks are tensor hooks,
not ``register_full_backward_hook`` (which wraps every output in an extra autograd node, changes
``grad_fn`` and breaks in-place ops downstream).
"""

from __future__ import annotations

import functools
import inspect as pyinspect
import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.nn.parameter import is_lazy

from layerlab.probe.report import CallRecord, TensorInfo
from layerlab.probe.stats import grad_norm, tensor_stats
from layerlab.target.bind import field_names, is_dataclass_instance


class ProbeBug(Exception):
    """An error inside layerlab's own hooks: re-raised as a bug, never blamed on the model."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(repr(original))
        self.original = original


_DTYPE_NAMES: Dict[torch.dtype, str] = {}


def dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


_DEVICE_NAMES: Dict[torch.device, str] = {}


def device_name(device: torch.device) -> str:
    """``str(device)``, remembered (it is asked for every tensor and parameter)."""
    name = _DEVICE_NAMES.get(device)
    if name is None:
        name = _DEVICE_NAMES[device] = str(device)
    return name


@functools.lru_cache(maxsize=None)
def forward_arg_names(cls: type) -> Tuple[str, ...]:
    """The positional parameter names of ``cls.forward`` (without ``self``)."""
    try:
        sig = pyinspect.signature(cls.forward)
    except (TypeError, ValueError):
        return ()
    kinds = (pyinspect.Parameter.POSITIONAL_ONLY, pyinspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = [p.name for p in sig.parameters.values() if p.kind in kinds]
    return tuple(names[1:] if names and names[0] == "self" else names)


def _plain_value(value: Any) -> Any:
    """A JSON-friendly stand-in for a non-tensor argument (small values as they are)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)) and len(value) <= 8 and all(
        isinstance(v, (bool, int, float, str, type(None))) for v in value
    ):
        return list(value)
    try:
        text = repr(value)
    except Exception:  # a user object whose __repr__ raises: its type still describes it
        return type(value).__name__
    return text if len(text) <= 40 else type(value).__name__


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # inference tensors have no version counter
        return -1


def _numel(p: torch.Tensor) -> int:
    """``p.numel()``, or 0 for a lazy module's parameter not materialised yet."""
    return 0 if is_lazy(p) else p.numel()


def nested_shape(t: torch.Tensor) -> List[Optional[int]]:
    """The sizes of a nested tensor: an int where every component agrees, ``None`` where they
    differ (a ragged dimension: ``[2, None, 16]`` for sequences of lengths 5 and 3)."""
    sizes: List[Optional[int]] = []
    for dim in range(t.dim()):
        try:
            size = t.size(dim)
        except RuntimeError:  # strided layout: a ragged dimension has no single size
            size = None
        sizes.append(size if isinstance(size, int) else None)  # jagged layout: a SymInt
    return sizes


def _holds_tensors(values) -> bool:
    return any(isinstance(v, (torch.Tensor, tuple, list, dict)) for v in values)


def flatten(value: Any, name: str = "", depth: int = 0) -> List[Tuple[str, Any]]:
    """``[(name, leaf)]`` for every element of nested tuples, lists, dicts and namedtuples.

    A sequence of plain values (``output_size=[12, 12]``) is one leaf.
    """
    if isinstance(value, torch.Tensor):  # the common case, without building anything
        return [(name, value)]
    out: List[Tuple[str, Any]] = []
    _flatten_into(out, value, name, depth)
    return out


def _flatten_into(out: list, value: Any, name: str, depth: int) -> None:
    if isinstance(value, torch.Tensor) or depth > 4:
        out.append((name, value))
    elif isinstance(value, (tuple, list)) and not _holds_tensors(value):
        out.append((name, value))
    elif isinstance(value, tuple) and hasattr(value, "_fields"):
        for field_name, v in zip(value._fields, value):
            _flatten_into(out, v, f"{name}.{field_name}", depth + 1)
    elif isinstance(value, (tuple, list)) and value and len(value) <= 64:
        for i, v in enumerate(value):
            _flatten_into(out, v, f"{name}[{i}]", depth + 1)
    elif isinstance(value, dict) and value and len(value) <= 64:
        for k, v in value.items():
            _flatten_into(out, v, f"{name}[{k}]", depth + 1)
    elif is_dataclass_instance(value):
        for field_name in field_names(value)[:64]:
            _flatten_into(out, getattr(value, field_name), f"{name}.{field_name}", depth + 1)
    else:
        out.append((name, value))


def _subtree_params(module: torch.nn.Module, memo: Dict[int, dict]) -> Dict[int, torch.nn.Parameter]:
    """``module.parameters()`` as ``{id: p}`` (each once), from the children's, memoised in ``memo``:
    one walk of the tree for all modules rather than one per module."""
    found = memo.get(id(module))
    if found is None:
        memo[id(module)] = found = {}  # a module reached again through a cycle adds nothing
        for p in module._parameters.values():
            if p is not None:
                found.setdefault(id(p), p)
        for child in module._modules.values():
            if child is not None:
                for key, p in _subtree_params(child, memo).items():
                    found.setdefault(key, p)
    return found


class Recorder:
    """Records every module call of ``root``; :meth:`install` / :meth:`remove` the hooks.

    Args:
        root: the model.
        stats: compute value statistics of inputs and outputs.
        grads: put a gradient hook on every tensor that requires grad.
    """

    def __init__(self, root: torch.nn.Module, *, stats: bool = True, grads: bool = True) -> None:
        self.root = root
        self.stats = stats
        self.grads = grads
        self.calls: List[CallRecord] = []
        self.modules: List[torch.nn.Module] = []
        self.live: Dict[int, Tuple[tuple, dict]] = {}
        self.stack: List[int] = []
        self.slot_stats: List[Optional[tuple]] = []
        self.slot_grads: List[Optional[torch.Tensor]] = []
        self.slot_producer: List[Optional[int]] = []
        self.grad_order: List[int] = []
        self._slots: Dict[int, Tuple[Any, int, int]] = {}
        self._counts: Dict[int, int] = {}
        self._info: Dict[int, Tuple[str, int, int, int]] = {}
        self._lazy: Dict[int, Tuple[Any, ...]] = {}  # id → parameters, for modules with lazy ones
        self._handles: list = []
        self._ended = 0
        self.trace = None  # an OpTrace of the same run: paused while the hooks do their own work

    # -- installation ----------------------------------------------------------------------------
    def install(self, named_modules: Optional[List[Tuple[str, torch.nn.Module]]] = None) -> None:
        """Hook every submodule (``named_modules``: ``root.named_modules()`` if the caller has it)."""
        if named_modules is None:
            named_modules = list(self.root.named_modules())
        subtree: Dict[int, Dict[int, torch.nn.Parameter]] = {}
        for path, module in named_modules:
            params = tuple(_subtree_params(module, subtree).values())
            self._info[id(module)] = (
                path,
                path.count(".") + 1 if path else 0,
                sum(_numel(p) for p in params),
                sum(_numel(p) for p in params if p.requires_grad),
            )
            if any(is_lazy(p) for p in params):  # counted again when the call returns
                self._lazy[id(module)] = params
            self._handles.append(module.register_forward_pre_hook(self._pre, with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._post, with_kwargs=True))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.live.clear()

    # -- slots -----------------------------------------------------------------------------------
    def _slot_of(self, t: torch.Tensor) -> Optional[int]:
        entry = self._slots.get(id(t))
        if entry is not None and entry[0]() is t and entry[1] == _version(t):
            return entry[2]
        return None

    def _new_slot(self, t: torch.Tensor, producer: Optional[int]) -> int:
        slot = len(self.slot_stats)
        self._slots[id(t)] = (weakref.ref(t), _version(t), slot)
        self.slot_stats.append(tensor_stats(t) if self.stats else None)
        self.slot_grads.append(None)
        self.slot_producer.append(producer)
        if self.grads and t.requires_grad:
            self._handles.append(t.register_hook(functools.partial(self._on_grad, slot)))
        return slot

    def _on_grad(self, slot: int, grad: torch.Tensor) -> None:
        try:
            self.slot_grads[slot] = grad_norm(grad)
            self.grad_order.append(slot)
        except Exception as exc:  # pragma: no cover - a bug in layerlab, not in the model
            raise ProbeBug(exc) from exc

    def _describe(self, name: str, value: Any, producer: Optional[int]) -> TensorInfo:
        if not isinstance(value, torch.Tensor):
            return TensorInfo(name=name, value=_plain_value(value))
        slot = self._slot_of(value)
        if slot is None:
            slot = self._new_slot(value, producer)
        fn = value.grad_fn
        nested = value.is_nested
        return TensorInfo(
            name=name,
            shape=nested_shape(value) if nested else list(value.shape),
            nested=nested,
            dtype=dtype_name(value.dtype),
            device=device_name(value.device),
            requires_grad=value.requires_grad,
            grad_fn=type(fn).__name__ if fn is not None else None,
            source=self.slot_producer[slot] if producer is None else None,
            slot=slot,
        )

    # -- hooks -----------------------------------------------------------------------------------
    def _pre(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        trace = self.trace
        if trace is not None:
            trace.paused += 1
        try:
            index = len(self.calls)
            key = id(module)
            count = self._counts[key] = self._counts.get(key, 0) + 1
            path, depth, params, trainable = self._info[key]
            record = CallRecord(
                index=index, path=path, class_name=type(module).__name__, depth=depth, call=count,
                parent=self.stack[-1] if self.stack else None, training=module.training,
                params=params, trainable=trainable, status="running",
            )
            names = forward_arg_names(type(module))
            inputs = []
            for i, arg in enumerate(args):
                base = names[i] if i < len(names) else f"args[{i}]"
                inputs.extend(self._describe(n, v, None) for n, v in flatten(arg, base))
            for key_name, arg in kwargs.items():
                inputs.extend(self._describe(n, v, None) for n, v in flatten(arg, key_name))
            record.inputs = inputs
            self.calls.append(record)
            self.modules.append(module)
            self.stack.append(index)
            self.live[index] = (args, kwargs)
        except Exception as exc:
            raise ProbeBug(exc) from exc
        finally:
            if trace is not None:
                trace.paused -= 1

    def _post(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        trace = self.trace
        if trace is not None:
            trace.paused += 1
        try:
            index = self.stack.pop()
            while self.modules[index] is not module:  # a child raised and this module caught it
                self.calls[index].status = "raised"
                self.live.pop(index, None)
                index = self.stack.pop()
            record = self.calls[index]
            record.outputs = [self._describe(n, v, index) for n, v in flatten(output, "")]
            record.status = "ok"
            lazy = self._lazy.get(id(module))
            if lazy is not None:  # materialised by now (a lazy module's own pre-hook ran first)
                record.params = sum(_numel(p) for p in lazy)
                record.trainable = sum(_numel(p) for p in lazy if p.requires_grad)
            record.end = self._ended
            self._ended += 1
            self.live.pop(index, None)
        except Exception as exc:
            raise ProbeBug(exc) from exc
        finally:
            if trace is not None:
                trace.paused -= 1

    def open_calls(self) -> List[int]:
        """Indices of the calls that started and never finished, outermost first."""
        return list(self.stack)

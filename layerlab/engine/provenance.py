"""Axis provenance: for every tensor of a forward, which input or parameter axis each axis came from.

A :class:`ProvenanceMode` (a :class:`torch.overrides.TorchFunctionMode`: torch's own dispatch
hook, nothing patched) labels the model's inputs (``input x axis 1``) and, op by op, every tensor
the forward makes, from the table of :mod:`layerlab.engine.op_semantics`. Parameters and buffers
are labelled where an op first meets them (``parameter fc.weight axis 0``). An op that is not in
the table gives unknown labels. Every op becomes a :class:`Record` (operands' and outputs' labels
and shapes, the user's source line, the events its rule noted); only metadata is kept.

Public API (for the findings of :mod:`layerlab.engine.silent` and the fix search):

    provenance_of(module, *inputs, meta=True, **kwargs) -> Provenance
        run the forward under the mode (on meta twins by default: no weights touched, no
        values computed) and return what it saw; it never raises for the model's sake: a forward
        that raises ends the run, with ``Provenance.failed`` saying which op.
    ProvenanceMode(root, named_inputs)            the mode itself, to wrap any forward you run
        (``with mode: out = model(x)``; then ``mode.result(out)``). ``mode.paused`` (a count, as
        on :class:`~layerlab.probe.ops.OpTrace`) makes it step aside: a Recorder given it as its
        ``trace`` pauses it while its hooks compute statistics.
    Provenance.labels(tensor_id) / .records / .atoms / .outputs
    Provenance.origins(labels) -> [AxisOrigin]    one readable origin per axis (input, role, size)
    Provenance.role(atom_id) -> "batch" | "seq" | "spatial" | "feature" | "param" | "new" | "unknown"
    Provenance.first_departure(record, operand, axis) -> Record | None
        the last op before ``record`` that moved or regrouped the axis now at ``axis`` of that
        operand: "which op first departs from what its consumer expects".
    Provenance.chain(record, operand, axis) -> [str]   "transpose at model.py:12", newest first

Roles of the input axes are learnt from the layers that consume them (see :meth:`Provenance.role`):
a conv's batch and spatial axes, an RNN's batch and time axes (``batch_first`` says which),
the ids of an Embedding, a class loss's batch axis; an axis a layer's weight is sized for is a
feature axis. The axis 0 of an input that nothing says more about is its batch axis.
"""

from __future__ import annotations

import os
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch.overrides import TorchFunctionMode

from layerlab.engine.labels import Atom, Label, Labels, plain
from layerlab.engine.axis_roles import AxisOrigin, Provenance
from layerlab.engine.op_semantics import TABLE

__all__ = ["AxisOrigin", "Record", "Provenance", "ProvenanceMode", "provenance_of", "named_tensors"]

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_NN_DIR = os.path.join(_TORCH_DIR, "nn", "modules") + os.sep
_LAYERLAB_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_LIB: Dict[str, bool] = {}

#: The most ops one run records (a forward looping over many small ops keeps the first ones).
MAX_RECORDS = 20_000


def _library(filename: str) -> bool:
    found = _LIB.get(filename)
    if found is None:
        found = _LIB[filename] = filename.startswith((_TORCH_DIR, _LAYERLAB_DIR)) or filename.endswith(
            os.sep + "contextlib.py")
    return found


_DISPLAY: Dict[str, str] = {}


def _display(filename: str) -> str:
    found = _DISPLAY.get(filename)
    if found is None:
        found = _DISPLAY[filename] = _relative(filename)
    return found


def _relative(filename: str) -> str:
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return os.path.basename(filename)
    return rel if not rel.startswith("..") else os.path.basename(filename)


@dataclass
class Record:
    """One op of the forward: its operands' and outputs' labels and shapes, where it was called.

    ``user``: called from the model's own code (not inside a torch.nn module's forward);
    ``module``: the torch.nn module whose forward called it, if any (its path in ``module_path``);
    ``producers``: for each operand, the index of the record that made it (``None``: an input, a
    parameter, a constant). ``events``: what the op's rule noted, ``(kind, data)``.
    """

    index: int
    op: str
    kind: str
    where: Optional[str]
    code: Optional[str]
    user: bool
    inputs: List[Labels] = field(default_factory=list)
    in_shapes: List[List[int]] = field(default_factory=list)
    producers: List[Optional[int]] = field(default_factory=list)
    outputs: List[Labels] = field(default_factory=list)
    out_shapes: List[List[int]] = field(default_factory=list)
    events: List[Tuple[str, dict]] = field(default_factory=list)
    module_path: Optional[str] = None
    module_class: Optional[str] = None
    args: Dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.op} at {self.where}" if self.where else self.op


class OpContext:
    """What a rule of the table sees for one call (see :mod:`layerlab.engine.op_semantics`)."""

    def __init__(self, mode: "ProvenanceMode", func, kind: str, name: str, args: tuple, kwargs: dict,
                 operands: list, outs: list, record: Record) -> None:
        self.mode, self.func, self.kind, self.name = mode, func, kind, name
        self.args, self.kwargs, self.outs, self.record = args, kwargs, outs, record
        self.in_labels = [mode.labels_of(t) for t in operands]
        self.in_shapes = [list(t.shape) for t in operands]
        self.out_shapes = [list(o.shape) for o in outs]

    def arg(self, i: int, name: str, default: Any = None) -> Any:
        if name in self.kwargs:
            return self.kwargs[name]
        return self.args[i] if i < len(self.args) else default

    def int_arg(self, i: int, name: str) -> int:
        value = self.arg(i, name)
        if not isinstance(value, int):
            raise _Unknown()
        return value

    def int_list(self, i: int, name: str) -> List[int]:
        if name in self.kwargs:
            value = self.kwargs[name]
        elif len(self.args) > i + 1 or (len(self.args) == i + 1 and isinstance(self.args[i], int)):
            value = self.args[i:]
        else:
            value = self.args[i]
        value = list(value)
        if not all(isinstance(v, int) for v in value):
            raise _Unknown()
        return value

    def labels_of(self, t: Any) -> Labels:
        return self.mode.labels_of(t) if isinstance(t, torch.Tensor) else ()

    def event(self, kind: str, **data: Any) -> None:
        self.record.events.append((kind, data))

    def new(self, what: str, size: int) -> Label:
        return plain(self.mode.atom("new", f"new axis of {self.record.label} ({what})", size,
                                    where=self.record.where), size)

    def inserted(self) -> Label:
        return plain(self.mode.atom("inserted", f"size-1 axis added by {self.record.label}", 1,
                                    where=self.record.where), 1)

    def param_axis(self, weight: Any, axis: int) -> Label:
        """The new axis a layer makes from its weight's ``axis`` (a Linear's outputs, an
        Embedding's features): a ``feature`` atom, one per weight axis, distinct from the
        parameter's own axis (a positional table added as it is stays a ``param`` axis)."""
        if not isinstance(weight, torch.Tensor) or axis >= weight.dim():
            return None
        labels = self.labels_of(weight)
        size = weight.shape[axis]
        base = labels[axis]
        if base is None or len(base) != 1:
            return plain(self.mode.atom("feature", f"features of {self.record.label}", size,
                                        where=self.record.where), size)
        return plain(self.mode.feature(base[0][0], size, self.record), size)

    def piece(self, atom: int, k: int, size: int) -> int:
        return self.mode.piece(atom, k, size, self.record.where)

    def join(self, parts) -> Label:
        return self.mode.join(parts)


class _Unknown(Exception):
    """A rule met arguments it cannot read (a tensor where an int was expected): unknown labels."""


class ProvenanceMode(TorchFunctionMode):
    """Label every tensor of a forward (see the module docstring). ``named_inputs``: ``[(name,
    tensor)]`` of the model's tensor inputs."""

    def __init__(self, root: Optional[torch.nn.Module], named_inputs: Sequence[Tuple[str, torch.Tensor]]) -> None:
        super().__init__()
        self.root = root
        self.atoms: List[Atom] = []
        self.records: List[Record] = []
        self.errors: List[BaseException] = []
        self.failed: Optional[Record] = None
        self.dropped = 0
        self.paused = 0
        self._labels: Dict[int, Tuple[Any, Labels, Optional[int]]] = {}
        self._pieces: Dict[Tuple[int, int, int], int] = {}
        self._features: Dict[int, int] = {}
        self._params: Optional[Dict[int, str]] = None
        self._modules: Optional[Dict[int, str]] = None
        self.inputs: Dict[str, Labels] = {}
        for name, t in named_inputs:
            labels = tuple(plain(self.atom("input", f"{name} axis {k}", s, input=name, axis=k), s)
                           for k, s in enumerate(t.shape))
            self.inputs[name] = labels
            self._set(t, labels, None)

    # -- atoms and labels ----------------------------------------------------------------------
    def atom(self, kind: str, name: str, size: int, **kw: Any) -> int:
        self.atoms.append(Atom(len(self.atoms), kind, name, size, **kw))
        return len(self.atoms) - 1

    def piece(self, atom: int, k: int, size: int, where: Optional[str]) -> int:
        key = (atom, k, size)
        found = self._pieces.get(key)
        if found is None:
            parent = self.atoms[atom]
            found = self._pieces[key] = self.atom("piece", f"{parent.name} (piece {k})", size, parent=atom,
                                                  where=where)
        return found

    def feature(self, param_atom: int, size: int, record: "Record") -> int:
        found = self._features.get(param_atom)
        if found is None:
            name = self.atoms[param_atom].name.replace("parameter ", "")
            owner, _, rest = name.rpartition(".")  # "qkv.weight axis 0" → the features of qkv
            name = f"{owner} features" if owner and rest.startswith("weight") else f"features from {name}"
            found = self._features[param_atom] = self.atom("feature", name, size, where=record.where)
        return found

    def join(self, parts) -> Label:
        """Pieces of one atom merged back in their order are that atom again."""
        parents = {self.atoms[a].parent for a, _ in parts}
        if len(parents) == 1 and None not in parents:
            parent = parents.pop()
            order = [a for a, _ in parts]
            expected = [self._pieces.get((parent, k, s)) for k, (_, s) in enumerate(parts)]
            if order == expected:
                size = 1
                for _, s in parts:
                    size *= s
                return plain(parent, size)
        return tuple(parts)

    def _set(self, t: torch.Tensor, labels: Labels, producer: Optional[int]) -> None:
        self._labels[id(t)] = (weakref.ref(t), labels, producer)

    def _entry(self, t: torch.Tensor):
        entry = self._labels.get(id(t))
        if entry is not None and entry[0]() is t and len(entry[1]) == t.dim():
            return entry
        return None

    def labels_of(self, t: torch.Tensor) -> Labels:
        entry = self._entry(t)
        if entry is not None:
            return entry[1]
        name = self._param_name(t)
        if name is not None and not isinstance(t, torch.nn.parameter.UninitializedTensorMixin):
            labels = tuple(plain(self.atom("param", f"parameter {name} axis {k}", s, axis=k), s)
                           for k, s in enumerate(t.shape))
            self._set(t, labels, None)
            return labels
        return (None,) * t.dim()

    def producer(self, t: torch.Tensor) -> Optional[int]:
        entry = self._entry(t)
        return entry[2] if entry is not None else None

    def _param_name(self, t: torch.Tensor) -> Optional[str]:
        if self._params is None:
            self._params = {}
            if self.root is not None:
                for name, p in self.root.named_parameters(remove_duplicate=False):
                    self._params.setdefault(id(p), name)
                for name, b in self.root.named_buffers(remove_duplicate=False):
                    self._params.setdefault(id(b), name)
        return self._params.get(id(t))

    def module_path(self, module: Any) -> Optional[str]:
        if self._modules is None:
            self._modules = {id(m): n for n, m in self.root.named_modules()} if self.root is not None else {}
        return self._modules.get(id(module))

    # -- the mode --------------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused:  # a recorder's hooks at work (it counts ``paused`` up and down)
            return func(*args, **kwargs)
        frames = _frames()
        if frames is None:  # layerlab's own hooks and statistics: not the model's ops
            return func(*args, **kwargs)
        try:
            out = func(*args, **kwargs)
        except Exception:
            try:
                self.failed = self._record(func, args, kwargs, None, frames)
            except Exception as bug:  # our own bookkeeping must never hide the model's exception
                self.errors.append(bug)
            raise
        if len(self.records) >= MAX_RECORDS:
            self.dropped += 1
            return out
        try:
            self._record(func, args, kwargs, out, frames)
        except Exception as bug:  # never break the model's forward: the labels are just unknown
            self.errors.append(bug)
        return out

    def _record(self, func, args, kwargs, out, frames) -> Optional[Record]:
        entry = TABLE.get(func) if _hashable(func) else None
        outs = _tensors(out) if out is not None else []
        if not outs and out is not None:
            return None
        user_frame, inner = frames
        where = code = None
        if user_frame is not None:
            filename, line = user_frame.f_code.co_filename, user_frame.f_lineno
            where = f"{_display(filename)}:{line}"
            import linecache
            code = linecache.getline(filename, line).strip() or None
        kind = entry[0] if entry else "unknown"
        record = Record(index=len(self.records), op=_op_name(func), kind=kind, where=where, code=code,
                        user=inner is None)
        if inner is not None and kind in ("contract",):
            module = inner.f_locals.get("self")
            record.module_path = self.module_path(module)
            record.module_class = type(module).__name__ if module is not None else None
        operands = _operands(args, kwargs)
        record.args = {str(i): a for i, a in enumerate(args) if isinstance(a, (int, float, bool, str))
                       or (isinstance(a, tuple) and all(isinstance(v, (int, float, bool)) for v in a))}
        if out is None:
            record.inputs = [self.labels_of(t) for t in operands]
            record.in_shapes = [list(t.shape) for t in operands]
            return record
        ctx = OpContext(self, func, kind, record.op, args, kwargs, operands, outs, record)
        record.inputs, record.in_shapes = ctx.in_labels, ctx.in_shapes
        record.producers = [self.producer(t) for t in operands]
        record.out_shapes = ctx.out_shapes
        labels = None
        if entry is not None and operands:
            try:
                labels = entry[1](ctx)
            except (_Unknown, IndexError, TypeError, ValueError, KeyError, AttributeError):
                labels = None
        if labels is None or len(labels) != len(outs):
            labels = [None] * len(outs)
        final = []
        for o, lab in zip(outs, labels):
            if lab is None or len(lab) != o.dim():
                lab = (None,) * o.dim()
            final.append(lab)
            self._set(o, lab, record.index)
        record.outputs = final
        self.records.append(record)
        return record

    def result(self, output: Any = None) -> "Provenance":
        outs = _tensors(output) if output is not None else []
        return Provenance(self.atoms, self.records, self.inputs, [self.labels_of(o) for o in outs],
                          [list(o.shape) for o in outs], self.failed, self.errors, self.dropped)


def _hashable(func) -> bool:
    try:
        hash(func)
    except TypeError:
        return False
    return True


def _op_name(func) -> str:
    name = getattr(func, "__name__", None) or type(func).__name__
    module = getattr(func, "__module__", None) or ""
    return f"F.{name}" if module.startswith("torch.nn.functional") else name


_OURS = (os.path.join(_LAYERLAB_DIR, "probe") + os.sep, os.path.join(_LAYERLAB_DIR, "engine") + os.sep)
_MODULE_DIRS = (_NN_DIR, os.path.join(_LAYERLAB_DIR, "layers") + os.sep)


def _frames():
    """``(user frame, inner)``: the first frame outside torch/layerlab, and the nearest torch.nn
    module ``forward`` frame on the way there (``None`` when the model's own code called the op).
    ``None`` for an op that layerlab's own recording code called (hooks, statistics)."""
    frame = sys._getframe(2)
    if frame.f_code.co_filename.startswith(_OURS):  # the common case first: a hook reading .shape
        return None
    inner = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _library(filename):
            return frame, inner
        if filename.startswith(_OURS) and inner is None:
            return None
        if inner is None and filename.startswith(_MODULE_DIRS) and frame.f_code.co_name == "forward":
            inner = frame
        frame = frame.f_back
    return None, inner


def _tensors(value: Any) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)) and len(value) <= 64:
        return [v for v in value if isinstance(v, torch.Tensor)]
    if isinstance(value, dict):
        return [v for v in value.values() if isinstance(v, torch.Tensor)]
    if hasattr(value, "to_tuple"):  # a transformers ModelOutput
        return _tensors(value.to_tuple())
    return []


def _operands(args: tuple, kwargs: dict) -> List[torch.Tensor]:
    found = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            found.append(a)
    return found


def provenance_of(module: torch.nn.Module, *inputs: Any, meta: bool = True, names: Optional[Sequence[str]] = None,
                  **kwargs: Any) -> Provenance:
    """Run ``module(*inputs, **kwargs)`` under a :class:`ProvenanceMode` and return what it saw.

    ``meta=True`` runs meta twins of the model and inputs (shapes only; the model is not
    touched). The model's own exception ends the run (``Provenance.failed``); it is not raised.
    """
    import contextlib

    from layerlab.probe.meta import meta_module, meta_value

    if meta:
        module, inputs, kwargs = meta_module(module), meta_value(inputs), meta_value(kwargs)
    named = named_tensors(inputs, kwargs, names)
    mode = ProvenanceMode(module, named)
    output = None
    with torch.random.fork_rng(devices=[]):
        try:
            with mode, torch.device("meta") if meta else contextlib.nullcontext():
                output = module(*inputs, **kwargs)
        except Exception:
            output = None
    return mode.result(output)


def named_tensors(inputs: Sequence[Any], kwargs: Dict[str, Any], names: Optional[Sequence[str]] = None):
    """``[(name, tensor)]`` of the tensors among a forward's arguments (one level into tuples)."""
    named = []
    for i, value in enumerate(inputs):
        name = names[i] if names is not None and i < len(names) else ("x" if len(inputs) == 1 else f"input {i}")
        if isinstance(value, torch.Tensor):
            named.append((name, value))
        elif isinstance(value, (list, tuple)):
            named += [(f"{name}[{k}]", v) for k, v in enumerate(value) if isinstance(v, torch.Tensor)]
    for name, value in kwargs.items():
        if isinstance(value, torch.Tensor):
            named.append((name, value))
    return named

"""The op trace: every torch function and tensor method the user's own code calls in a forward.

:class:`OpTrace` is a :class:`torch.overrides.TorchFunctionMode` (torch's own dispatch hook: no
function of torch is patched). While it is active, each call of a torch function or tensor method
made from the user's code (``x.transpose(1, 2)``, ``torch.cat``, ``q @ k``, ``F.softmax``,
``scores.masked_fill``) becomes an :class:`~layerlab.probe.report.OpRecord`: the op, its operands'
shapes and dtypes and what made each of them (a module call or an earlier op), the output shapes,
and the user's source line (the first frame outside torch and layerlab). Only metadata is kept,
never a tensor.

What is *not* recorded:

* ops inside a torch.nn (or layerlab) module's own forward (``F.linear`` inside ``nn.Linear``):
  the module's row already says what happened; they cost one dict lookup each;
* queries that return no tensor (``x.shape``, ``x.size(0)``, ``x.dim()``);
* the ops layerlab's own hooks run (the :class:`~layerlab.probe.hooks.Recorder` pauses the trace).

When an op raises, its record gets ``status="raised"`` and :attr:`OpTrace.failed` keeps the live
arguments (until the trace is dropped) so that the rules of :mod:`layerlab.probe.op_rules` can
look at them. ``substitutions`` lets a verified fix replace one op at one source line
(:mod:`layerlab.probe.fixes`).
"""

from __future__ import annotations

import contextlib
import linecache
import os
import re
import sys
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode

from layerlab.probe.hooks import Recorder, _plain_value, _version, dtype_name
from layerlab.probe.report import OpRecord, Operand

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_LAYERLAB_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_CONTEXTLIB = os.path.dirname(os.__file__) + os.sep + "contextlib.py"

#: How many ops one trace keeps at most (a forward that loops over a million small ops keeps
#: the first ones, and says so through ``OpTrace.dropped``).
MAX_OPS = 20_000

_LIBRARY_FILE: Dict[str, bool] = {}
_LIBRARY_CLASS: Dict[type, bool] = {}
_NAMES: Dict[Any, str] = {}


def _library_file(filename: str) -> bool:
    found = _LIBRARY_FILE.get(filename)
    if found is None:
        found = _LIBRARY_FILE[filename] = (
            filename.startswith((_TORCH_DIR, _LAYERLAB_DIR)) or filename == _CONTEXTLIB
        )
    return found


def library_class(cls: type) -> bool:
    """A torch.nn (or layerlab) module class: its forward's ops are its own business."""
    found = _LIBRARY_CLASS.get(cls)
    if found is None:
        module = getattr(cls, "__module__", "") or ""
        found = _LIBRARY_CLASS[cls] = module.startswith(("torch.", "layerlab."))
    return found


def op_name(func: Any) -> str:
    """``transpose``, ``cat``, ``F.softmax``, ``__getitem__`` … for a torch function or method."""
    try:
        found = _NAMES.get(func)
    except TypeError:
        found = None
    if found is not None:
        return found
    name = getattr(func, "__name__", None) or type(func).__name__
    module = getattr(func, "__module__", None) or ""
    if module.startswith("torch.nn.functional") or module == "torch._C._nn":
        name = f"F.{name}"
    try:
        _NAMES[func] = name
    except TypeError:
        pass
    return name


def _user_frame():
    """The first frame outside torch, layerlab and contextlib (the user's code), or ``None``."""
    frame = sys._getframe(2)
    while frame is not None and _library_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def _display_path(filename: str) -> str:
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return os.path.basename(filename)
    return rel if not rel.startswith("..") else os.path.basename(filename)


def _tensor_leaves(value: Any, name: str, out: list, depth: int = 0) -> None:
    if isinstance(value, torch.Tensor):
        out.append((name, value))
    elif isinstance(value, (list, tuple)) and depth < 2 and len(value) <= 64:
        for i, v in enumerate(value):
            _tensor_leaves(v, f"{name}[{i}]", out, depth + 1)


def tensor_operands(args: tuple, kwargs: dict) -> List[Tuple[str, torch.Tensor]]:
    """``[(name, tensor)]`` for the tensor arguments of one op call (lists opened two levels):
    ``0``, ``0[1]`` (``torch.cat([a, b])``), ``mask`` for a keyword."""
    leaves: list = []
    for i, a in enumerate(args):
        _tensor_leaves(a, str(i), leaves)
    for k, a in kwargs.items():
        _tensor_leaves(a, k, leaves)
    return leaves


def _outputs(value: Any) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)) and len(value) <= 64:
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


@dataclass
class FailedOp:
    """The op that raised, with its live arguments (kept only while the trace is)."""

    record: OpRecord
    func: Any
    args: tuple
    kwargs: dict
    exc: BaseException


#: ``(absolute file, line, op name) → transform(func, args, kwargs) -> (func, args, kwargs)``
Substitutions = Dict[Tuple[str, int, str], Callable]


class OpTrace(TorchFunctionMode):
    """Record the user-level ops of a forward (use as a context manager around it).

    Args:
        recorder: the :class:`~layerlab.probe.hooks.Recorder` of the same run (it says which module
            call is running, and which call's output a tensor is).
        substitutions: ops to replace at given source lines (a verified fix's run).
    """

    def __init__(self, recorder, substitutions: Optional[Substitutions] = None) -> None:
        super().__init__()
        self.recorder = recorder
        self.records: List[OpRecord] = []
        self.failed: Optional[FailedOp] = None
        self.paused = 0
        self.dropped = 0
        self.substitutions = substitutions or {}
        self._made: Dict[int, Tuple[Any, int, int]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rec = self.recorder
        if self.paused:
            return func(*args, **kwargs)
        call = rec.stack[-1] if rec.stack else None
        if call is not None and library_class(type(rec.modules[call])):
            return func(*args, **kwargs)
        name = op_name(func)
        frame = _user_frame()
        file, line = (frame.f_code.co_filename, frame.f_lineno) if frame is not None else (None, None)
        if self.substitutions and file is not None:
            change = self.substitutions.get((file, line, name))
            if change is not None:
                func, args, kwargs = change(func, args, kwargs)
        try:
            out = func(*args, **kwargs)
        except Exception as exc:
            record = self._record(name, call, args, kwargs, file, line, [])
            record.status = "raised"
            self.failed = FailedOp(record, func, args, kwargs, exc)
            raise
        outs = _outputs(out)
        if outs:
            self._record(name, call, args, kwargs, file, line, outs)
        return out

    # -- records -----------------------------------------------------------------------------------
    def _record(self, name, call, args, kwargs, file, line, outs) -> OpRecord:
        rec = self.recorder
        record = OpRecord(index=len(self.records), op=name, call=call, after_call=len(rec.calls))
        named = [*((str(i), a) for i, a in enumerate(args)), *kwargs.items()]
        record.inputs = [self._operand(n, t) for n, t in tensor_operands(args, kwargs)]
        record.args = {n: _plain_value(a) for n, a in named if not isinstance(a, torch.Tensor) and not _holds_tensor(a)}
        record.outputs = [list(o.shape) for o in outs]
        record.out_dtypes = [dtype_name(o.dtype) for o in outs]
        record.contiguous = [_contiguous(o) for o in outs]
        if file is not None:
            record.source = f"{_display_path(file)}:{line}"
            record.code = linecache.getline(file, line).strip() or None
            record.file, record.line = file, line  # not dataclass fields: kept out of the JSON
            if _is_method(record, args) and record.code:
                found = set(re.findall(r"([A-Za-z_][\w.]*(?:\[[^\]]*\])?)\s*\.\s*" + re.escape(name) + r"\s*\(", record.code))
                record.receiver = found.pop() if len(found) == 1 else None  # two receivers on one line: unknown
        for operand in record.inputs:  # "x" for the tensor a method was called on, arg1, arg2[0] … else
            head, bracket, rest = operand.name.partition("[")
            if head == "0" and record.receiver:
                operand.name = record.receiver + (bracket + rest if bracket else "")
            elif head.isdigit():
                operand.name = f"arg{operand.name}"
        if len(self.records) < MAX_OPS:
            self.records.append(record)
            for o in outs:
                self._made[id(o)] = (weakref.ref(o), _version(o), record.index)
        else:
            self.dropped += 1
        return record

    def _operand(self, name: str, t: torch.Tensor) -> Operand:
        entry = self._made.get(id(t))
        from_op = entry[2] if entry is not None and entry[0]() is t and entry[1] == _version(t) else None
        from_call = None
        if from_op is None:
            slot = self.recorder._slot_of(t)
            if slot is not None:
                from_call = self.recorder.slot_producer[slot]
        operand = Operand(name=name, shape=list(t.shape), dtype=dtype_name(t.dtype), from_call=from_call, from_op=from_op)
        if isinstance(t, torch.nn.Parameter) and from_op is None and from_call is None:
            operand.parameter = self._parameter_name(t)  # not a dataclass field: kept out of the JSON
        return operand

    def _parameter_name(self, t: torch.Tensor) -> Optional[str]:
        root = getattr(self.recorder, "root", None)
        for qualified, value in (root.named_parameters() if root is not None else ()):
            if value is t:
                return qualified
        return None

    def made_by(self, t: torch.Tensor) -> Tuple[Optional[int], Optional[int]]:
        """``(op index, call index)``: what produced ``t`` (both ``None`` for a model input)."""
        operand = self._operand("", t)
        return operand.from_op, operand.from_call


def _is_method(record: OpRecord, args: tuple) -> bool:
    return not record.op.startswith(("F.", "_")) and bool(args) and isinstance(args[0], torch.Tensor) \
        and hasattr(torch.Tensor, record.op)


def _holds_tensor(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value)


def _contiguous(t: torch.Tensor) -> bool:
    try:
        return t.is_contiguous()
    except RuntimeError:  # sparse, nested
        return True


@contextlib.contextmanager
def tracing(model: torch.nn.Module, substitutions: Optional[Substitutions] = None):
    """Module hooks without statistics plus the op trace around a forward of ``model`` (a copy
    being replayed or fixed): yields ``(recorder, trace)``; the hooks are removed on the way out.
    The recorder must be installed: it is what tells the trace which ops are torch.nn's own."""
    recorder = Recorder(model, stats=False, grads=False)
    trace = recorder.trace = OpTrace(recorder, substitutions=substitutions)
    recorder.install()
    try:
        with trace:
            yield recorder, trace
    finally:
        recorder.remove()

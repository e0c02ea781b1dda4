"""What a diagnosis rule may look at: the failing call, its live arguments, and where they came from.

A :class:`FailureContext` is built once per failure (in the real run, and again for every step of
a fix's verification). Rules read the module and its arguments through it, ask where a tensor was
made (:meth:`FailureContext.made_by`: an op of the user's code or a module call, from the op trace
and the recorder), and name an argument so that a fix can change it (:meth:`FailureContext.locate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple, Union

import torch

from layerlab.probe.hooks import flatten, forward_arg_names
from layerlab.probe.report import CallRecord, OpRecord, Origin

#: How many steps back an origin is followed.
ORIGIN_STEPS = 4


@dataclass
class FailureContext:
    """The failing call (``module`` at ``path`` with ``args``/``kwargs``; ``module`` is ``None`` when
    the exception came from outside any module call) and the exception."""

    module: Optional[torch.nn.Module]
    path: str
    args: tuple
    kwargs: dict
    exc: BaseException
    recorder: Any
    trace: Any = None
    #: ``(path, args, kwargs)`` of the calls around the failing one, outermost first (where a fix
    #: of a model input is applied: ``pixel_values`` at the root, not deep inside).
    outer: List[Tuple[str, tuple, dict]] = field(default_factory=list)
    #: For the ``refine`` rules only: the Diagnosis a module rule made, which they may make precise.
    found: Any = None

    # -- arguments ---------------------------------------------------------------------------------
    def arg(self, name: str, position: int) -> Any:
        """The forward argument ``name`` (or at ``position`` when passed positionally)."""
        if name in self.kwargs:
            return self.kwargs[name]
        names = forward_arg_names(type(self.module)) if self.module is not None else ()
        if name in names:
            position = names.index(name)
        return self.args[position] if position < len(self.args) else None

    def key(self, name: str, position: int) -> Union[int, str]:
        """How the argument ``name`` was passed: its position, or its keyword."""
        if name in self.kwargs:
            return name
        names = forward_arg_names(type(self.module)) if self.module is not None else ()
        return names.index(name) if name in names else position

    def tensors(self) -> List[torch.Tensor]:
        leaves = [v for _, v in flatten(list(self.args))] + [v for _, v in flatten(dict(self.kwargs))]
        return [v for v in leaves if isinstance(v, torch.Tensor)]

    def locate(self, t: torch.Tensor) -> Optional[Union[int, str]]:
        for i, a in enumerate(self.args):
            if a is t:
                return i
        for k, a in self.kwargs.items():
            if a is t:
                return k
        return None

    def passed_at(self, x: torch.Tensor, name: str, position: int, unnamed: str = "x"
                  ) -> Tuple[str, Union[int, str], str]:
        """``(path, key, name)`` of the outermost call that received ``x`` itself as an argument: where
        the user passes it, so a fix of a model input is written there (not deep inside, where the layers
        around would still read the old value). ``name``/``position``: the failing call's argument, used
        when no outer call received ``x``; ``unnamed``: what a positional argument past the forward's
        named parameters is called."""
        for path, args, kwargs in self.outer:
            names: Tuple[str, ...] = ()
            try:
                module = self.recorder.root.get_submodule(path) if path else self.recorder.root
                names = tuple(forward_arg_names(type(module)))
            except Exception:  # noqa: BLE001 - a path the recorder cannot resolve: positions go unnamed
                pass
            for i, a in enumerate(args):
                if a is x:
                    return path, i, names[i] if i < len(names) else unnamed
            for k, a in kwargs.items():
                if a is x:
                    return path, k, k
        return self.path, self.key(name, position), name

    # -- where tensors came from -------------------------------------------------------------------
    @property
    def failed_op(self):
        """The op of the user's code that raised this very exception, if the trace saw it."""
        failed = getattr(self.trace, "failed", None)
        if failed is None:
            return None
        exc = self.exc
        if failed.exc is exc or exc.__cause__ is failed.exc or exc.__context__ is failed.exc:
            return failed
        return None

    def made_by(self, t: torch.Tensor) -> Tuple[Optional[int], Optional[int]]:
        """``(op index, call index)`` that produced ``t``."""
        if self.trace is not None:
            return self.trace.made_by(t)
        slot = self.recorder._slot_of(t)
        return None, (self.recorder.slot_producer[slot] if slot is not None else None)

    def op(self, index: Optional[int]) -> Optional[OpRecord]:
        return self.trace.records[index] if index is not None and self.trace is not None else None

    def call(self, index: Optional[int]) -> Optional[CallRecord]:
        return self.recorder.calls[index] if index is not None else None

    def producer(self, t: torch.Tensor) -> Optional[CallRecord]:
        """The module call whose output ``t`` is, looking through shape-keeping ops of the user's
        code (``F.relu``, dropout, ``+`` of a bias) and shape-keeping modules (``nn.ReLU``,
        ``nn.Dropout``: :data:`~layerlab.probe.layout.ELEMENTWISE`), but not through anything that
        moves axes: what made the data, so that its layout is known."""
        op_index, call_index = self.made_by(t)
        for _ in range(ORIGIN_STEPS):
            if op_index is None:
                break
            record = self.op(op_index)
            same = [i for i in record.inputs if i.shape == (record.outputs[0] if record.outputs else None)]
            if not same:
                return None
            op_index, call_index = same[0].from_op, same[0].from_call
        return self.through_elementwise(self.call(call_index))

    def through_elementwise(self, call, steps: int = ORIGIN_STEPS):
        """``call``, or the call behind the elementwise modules that took its output unchanged in shape:
        in ``Sequential(conv, nn.ReLU())`` the layout is the conv's."""
        from layerlab.probe.layout import ELEMENTWISE  # layout imports this module

        for _ in range(steps):
            if call is None or call.class_name not in ELEMENTWISE:
                break
            ins, outs = call.tensor_inputs, call.tensor_outputs
            if not ins or not outs or ins[0].shape != outs[0].shape or ins[0].source is None:
                break
            call = self.call(ins[0].source)
        return call

    def producer_op(self, t: torch.Tensor) -> Optional[OpRecord]:
        return self.op(self.made_by(t)[0])

    def origin(self, name: str, t: torch.Tensor) -> Origin:
        op_index, call_index = self.made_by(t)
        if op_index is None and call_index is None:
            owned = self.owner(t)
            if owned is not None:  # not a model input: Origin says so when it has no steps
                return Origin(input=name, shape=list(t.shape), steps=[owned])
        return origin_from(name, list(t.shape), op_index, call_index, self)

    def origins(self, named) -> str:
        """``"a [2, 5, 32] came from …; b …"`` for ``(name, tensor)`` pairs."""
        return "; ".join(self.origin(name, t).text for name, t in named)

    def owner(self, t: torch.Tensor) -> Optional[str]:
        """``the parameter `pos``` when ``t`` is a parameter or buffer of the model."""
        root = getattr(self.recorder, "root", None)
        if root is None:
            return None
        for kind, named in (("parameter", root.named_parameters), ("buffer", root.named_buffers)):
            for qualified, value in named():
                if value is t:
                    return f"the {kind} `{qualified}`"
        return None


def op_text(record: OpRecord) -> str:
    """``x.transpose(1, 2)``, ``cat(dim=0)``: the op with its plain arguments (and the expression
    a method was called on, when the source line shows it)."""
    parts = []
    for k, v in record.args.items():
        text = repr(v) if isinstance(v, str) else f"{v:.4g}" if isinstance(v, float) else str(v)
        parts.append(text if k.isdigit() else f"{k}={text}")
    head = f"{record.receiver}.{record.op}" if record.receiver else record.op
    return f"{head}({', '.join(parts)})"


def op_tensors(failed) -> List[torch.Tensor]:
    """The tensor arguments of a failed op (``FailedOp``), in the order of its record's operands."""
    from layerlab.probe.ops import tensor_operands

    return [t for _, t in tensor_operands(failed.args, failed.kwargs)]


def loss_operands(failed) -> Tuple[Any, Any]:
    """``(input, target)`` of a failing loss call ``F.…(input, target, …)``, passed by position or keyword."""
    pred = failed.args[0] if failed.args else failed.kwargs.get("input")
    target = failed.args[1] if len(failed.args) > 1 else failed.kwargs.get("target")
    return pred, target


def op_site(record: OpRecord, **params) -> dict:
    """The ``params`` of a ``replace-op`` fix for ``record``'s call at its source line."""
    return {"file": getattr(record, "file", None), "line": getattr(record, "line", None), "op": record.op, **params}


def op_at(record: OpRecord) -> str:
    """`` at model.py:41`` (empty when the line is unknown)."""
    return f" at {record.source}" if record.source else ""


def origin_from(name: str, shape: List[int], op_index: Optional[int], call_index: Optional[int],
                ctx: FailureContext) -> Origin:
    """Follow ``op_index``/``call_index`` back through single-input ops to a module or an input."""
    steps: List[str] = []
    while len(steps) < ORIGIN_STEPS:
        record = ctx.op(op_index)
        if record is not None:
            where = f" at {record.source}" if record.source else ""
            steps.append(f"`{op_text(record)}`{where}")
            if len(record.inputs) != 1:
                break
            source = record.inputs[0]
            if getattr(source, "parameter", None):  # self.pos[:, :T]: a slice of the model's own table
                steps.append(f"the parameter `{source.parameter}` {source.shape}")
                break
            op_index, call_index = source.from_op, source.from_call
            continue
        call = ctx.call(call_index)
        if call is not None:
            steps.append(f"`{call.label}` ({call.class_name})")
        elif steps:
            steps.append("a model input")
        break
    return Origin(input=name, shape=shape, steps=steps)

"""The ``steps`` probe (``inspect --steps``): recurrent layers over time, step by step.

For every call of a recurrent layer — torch.nn's ``RNN``/``LSTM``/``GRU`` and ``RNNCell``/``LSTMCell``/
``GRUCell``, and layerlab's own (:mod:`layerlab.layers.recurrent`, :mod:`layerlab.layers.cells`) — per
time step t:

    ‖h_t‖        the norm of the output at step t (over batch and features; for a bidirectional
                 layer both directions' features; for a cell, its ``h'``), from the output sequence
    ‖∂L/∂x_t‖    the norm of the gradient of the loss w.r.t. the layer's input at step t, through
                 this layer only
    σ / tanh sat the fraction of sigmoid gates below 0.01 or above 0.99 and of tanh values with
                 ``|·| > 0.99`` at step t, over layers and directions (layerlab's layers only; see
                 :mod:`layerlab.probe.probes.gate_saturation`)

A sequence layer's steps are its time axis (dim 1 with ``batch_first`` and a batched input, dim 0
otherwise, unbatched inputs included); a cell's steps are its calls, in order (a cell run in a loop).
``num_layers > 1``, ``bidirectional`` and ``proj_size`` are covered; a ``PackedSequence`` input is not
(the row is left out and the note says so).

How ‖∂L/∂x_t‖ is measured without changing the model's results: a tensor hook on the layer's
input would see the gradient of *every* use of that tensor (a residual around the layer adds its
own), and there is none when the input does not require grad. So, after the forward, the layer's
``forward`` is run once more, outside the recorded run (no hooks, no op trace), on a detached copy
of its input that requires grad, with the RNG state the real call started with (the same dropout
masks) — and its outputs must equal the real ones exactly, or no gradient is shown. Tensor hooks on
the real outputs catch ``∂L/∂out`` during inspect's backward; then ``torch.autograd.grad`` of the
replay's outputs with those gradients gives ``∂L/∂x`` through this layer alone. The model, its
outputs and the report's gradients are untouched; the cost is one more forward and backward of
each recurrent layer.

Finding: when the gradient reaching the first step is below :data:`VANISH_RATIO` of the last
step's (a bidirectional layer: the smallest step against the largest), the signal from early steps
vanishes over time. inspect's default loss reads every output step, so a healthy layer gets
comparable gradients at every step (a stock LSTM: min/max ≈ 0.4–0.7); a loss on the last step
only shows what the layer carries back (a stock LSTM at T = 20: about 6e-5). A layerlab layer
whose gates are on average more than :data:`SATURATED` saturated gets a finding too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch
from torch import nn

from layerlab.probe.probes.base import Probe, ProbeResult, ProbeRun, quiet
from layerlab.probe.probes.gate_saturation import GateWatch

__all__ = ["StepsProbe", "VANISH_RATIO", "SATURATED"]

VANISH_RATIO = 1e-3
SATURATED = 0.5

#: a bidirectional layer's grad_ratio is the smallest step's over the largest's (the row's flags say so)
COLUMNS = {"steps": "T", "h_last": "‖h_T‖", "grad_ratio": "grad x₀/x_T", "sigmoid_sat": "σ sat",
           "tanh_sat": "tanh sat"}


@dataclass
class _Call:
    path: str
    module: nn.Module
    kind: str  # "sequence" | "cell"
    number: int
    args: tuple
    kwargs: dict
    output: Any
    rng: Any
    h_norm: List[float]
    ops: Optional[list] = None
    grads: List[Optional[torch.Tensor]] = field(default_factory=list)
    replay: Optional[tuple] = None  # (x copy, its place, replay outputs)
    grad_norm: Optional[List[float]] = None
    skipped: Optional[str] = None


def recurrent_kind(module: nn.Module) -> Optional[str]:
    """``"sequence"`` for RNN/LSTM/GRU, ``"cell"`` for their cells (torch's or layerlab's), else ``None``."""
    from layerlab.layers._recurrent_base import RNNBase
    from layerlab.layers.cells import _CellBase

    if isinstance(module, (nn.RNNBase, RNNBase)):
        return "sequence"
    if isinstance(module, (nn.RNNCellBase, _CellBase)):
        return "cell"
    return None


class StepsProbe(Probe):
    """Per time step: hidden-state norm, gradient norm reaching the step's input, gate saturation."""

    name = "steps"
    title = "Recurrent layers over time"
    needs_backward = True

    def __init__(self) -> None:
        self._calls: List[_Call] = []
        self._watch: Optional[GateWatch] = None
        self._packed: List[str] = []
        self._backward = False

    def attach(self, run: ProbeRun) -> None:
        self._backward = run.backward
        for path, module in run.named_modules:
            kind = recurrent_kind(module)
            if kind is None:
                continue
            ours = type(module).__module__.startswith("layerlab.layers")
            if ours and self._watch is None:
                self._watch = GateWatch()
                watch = self._watch
                run.context(lambda: watch)
            self._hook(run, path, module, kind, ours)

    def _hook(self, run: ProbeRun, path: str, module: nn.Module, kind: str, ours: bool) -> None:
        started: List[tuple] = []  # (number, rng state) of the calls running now
        count = [0]

        def pre(mod, args, kwargs):
            count[0] += 1
            with quiet():
                started.append((count[0], _rng_state(args)))
            if ours:
                self._watch.enter()

        def post(mod, args, kwargs, output):
            number, rng = started.pop()
            ops = self._watch.leave() if ours else None
            x, _ = _first_input(args, kwargs)
            out = _first_tensor(output)
            if not isinstance(x, torch.Tensor) or out is None:
                self._packed.append(path or "(root)")
                return
            rec = _Call(path, mod, kind, number, args, kwargs, output, rng, _h_norms(mod, kind, x, out), ops)
            from layerlab.probe.hooks import flatten

            tensors = [t for _, t in flatten(output) if isinstance(t, torch.Tensor)]
            rec.grads = [None] * len(tensors)
            for i, t in enumerate(tensors):
                if t.requires_grad:
                    run.tensor_hook(t, lambda grad, i=i, rec=rec: rec.grads.__setitem__(i, grad.detach()))
            self._calls.append(rec)

        run.forward_hook(module, pre, pre=True, with_kwargs=True)
        run.forward_hook(module, post, with_kwargs=True)

    def after_forward(self, run: ProbeRun, output: Any) -> None:
        if not run.backward:
            return
        for rec in self._calls:
            try:
                _replay(rec)
            except Exception as exc:  # the layer's own forward, run again, raised: say so, blame nothing
                rec.skipped = f"its forward could not be run again ({type(exc).__name__}: {exc})"

    def after_backward(self, run: ProbeRun) -> None:
        for rec in self._calls:
            if rec.replay is None:
                continue
            x2, _, outs2 = rec.replay
            pairs = [(o, g) for o, g in zip(outs2, rec.grads) if g is not None and o.requires_grad]
            if not pairs:
                rec.skipped = "no gradient reached its outputs"
            else:
                try:
                    (g,) = torch.autograd.grad([o for o, _ in pairs], [x2], [g for _, g in pairs], allow_unused=True)
                except RuntimeError as exc:  # e.g. a backward the layer does not support twice
                    rec.skipped = f"autograd could not differentiate its replay ({exc})"
                else:
                    g = torch.zeros_like(x2) if g is None else g
                    with quiet():
                        rec.grad_norm = _per_step(rec.module, rec.kind, rec.args, rec.kwargs, g)
            rec.replay = None
        for rec in self._calls:  # nothing of the run is kept past this point
            rec.args, rec.kwargs, rec.output, rec.grads = (), {}, None, []

    def result(self, report: Any) -> ProbeResult:
        from layerlab.probe.probes.steps_rows import rows_and_findings

        result = ProbeResult(name=self.name, title=self.title, columns=dict(COLUMNS))
        result.rows, result.findings = rows_and_findings(self._calls)
        notes = []
        if not self._calls and not self._packed:
            notes.append("no recurrent layer ran (RNN/LSTM/GRU or their cells, torch's or layerlab's)")
        if self._packed:
            notes.append(f"not covered (PackedSequence or non-tensor input): {', '.join(self._packed)}")
        if not self._backward:
            notes.append("no backward pass: no gradient per step")
        notes.append(f"‖∂L/∂x_t‖ through each layer alone (its forward replayed on a copy of its input, outputs "
                     f"checked equal), flagged when step 0's is below {VANISH_RATIO:g} of the last step's; "
                     "gate saturation for layerlab's layers only")
        result.note = "; ".join(notes)
        result.summary = {"vanish_ratio": VANISH_RATIO, "saturated": SATURATED}
        self._calls = []
        return result


def _first_input(args: tuple, kwargs: dict):
    if args:
        return args[0], 0
    return kwargs.get("input"), "input"


def _first_tensor(output: Any) -> Optional[torch.Tensor]:
    value = output[0] if isinstance(output, (tuple, list)) and output else output
    return value if isinstance(value, torch.Tensor) and value.is_floating_point() else None


def _time_dim(module: nn.Module, x: torch.Tensor) -> int:
    batched = x.dim() == 3
    return 1 if batched and getattr(module, "batch_first", False) else 0


def _per_step(module, kind, args, kwargs, value_like_input: torch.Tensor) -> List[float]:
    """Norms per step of a tensor shaped like the call's input (a cell: one norm)."""
    x, _ = _first_input(args, kwargs)
    return _norms(module, kind, x, value_like_input)


def _h_norms(module, kind, x, out) -> List[float]:
    with quiet():  # no graph, and neither the op trace nor another probe's mode sees these ops
        return _norms(module, kind, x, out.detach())


def _norms(module, kind, x, t: torch.Tensor) -> List[float]:
    if kind == "cell":
        return [float(torch.linalg.vector_norm(t.double()))]
    dim = _time_dim(module, x)
    steps = t.movedim(dim, 0).reshape(t.shape[dim], -1).double()
    return torch.linalg.vector_norm(steps, dim=1).tolist()


def _rng_state(args: tuple):
    states = {"cpu": torch.get_rng_state()}
    x = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if x is not None and x.device.type == "cuda":
        states["cuda"] = (x.device.index or 0, torch.cuda.get_rng_state(x.device))
    return states


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_detached(v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_detached(v) for v in value)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


def _replay(rec: _Call) -> None:
    """Run the layer's forward again on a copy of its input that requires grad (see the module docstring)."""
    from layerlab.probe.hooks import flatten

    if list(rec.module.children()):
        rec.skipped = "it has submodules: its forward is not replayed"
        return
    x, place = _first_input(rec.args, rec.kwargs)
    if not x.is_floating_point():
        rec.skipped = "its input is not floating point"
        return
    x2 = x.detach().requires_grad_(True)
    args, kwargs = list(_detached(rec.args)), _detached(rec.kwargs)
    if place == 0:
        args[0] = x2
    else:
        kwargs[place] = x2
    devices = [rec.rng["cuda"][0]] if "cuda" in rec.rng else []
    with torch.random.fork_rng(devices=devices), torch.enable_grad():
        torch.set_rng_state(rec.rng["cpu"])
        if devices:
            torch.cuda.set_rng_state(rec.rng["cuda"][1], rec.rng["cuda"][0])
        out2 = rec.module.forward(*args, **kwargs)
    real = [t for _, t in flatten(rec.output) if isinstance(t, torch.Tensor)]
    again = [t for _, t in flatten(out2) if isinstance(t, torch.Tensor)]
    if len(real) != len(again) or not all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(real, again)):
        rec.skipped = "its forward, run again with the same input and RNG state, gave other outputs: no gradient shown"
        return
    rec.replay = (x2, place, again)

"""Oracles: does a fixed copy compute a *plausible* model, not only run?

A fix that makes a model run can still be wrong: a layer resized to a size that only one input
length has, attention across the batch because ``batch_first`` was flipped to fit a mask, a norm
that reads the sequence axis as channels after a bare ``squeeze()`` ate the batch. Each oracle here
is a cheap, mechanical check of one property every ordinary model has, run on the fixed copy
(:class:`~layerlab.probe.fixes.FixedModel`) with small inputs derived from the user's own:

* ``backward``: forward and backward run (a loss ``⟨out, R⟩`` over the floating outputs);
* ``batch``: batch independence, in eval mode (BatchNorm in train mode mixes samples by design):
  sample 0's output must not change when the other samples change;
* ``sizes`` (:mod:`layerlab.engine.oracle_sizes`): the model runs at another size of every *free* axis of its inputs — the batch, and the
  sequence/spatial axes the original model did not tie to a size before the failure — and the
  output's batch axis follows; failing again at a layer or op the fix changed means the fix tied a
  parameter to that size (``in_features = T·C``, a layer resized to the batch). One exception, by
  design of many models: the spatial axes of an image (a 4-D/5-D floating input) may be tied — a
  classifier's ``Linear`` after ``Flatten`` is sized for one image size; that is noted, not failed;
* ``causal``: where the original code builds a causal mask (``triu``/``tril``, ``is_causal=True``),
  output step t must not read input steps after t.

Minimality (fewest edits, fewest parameters changed) ranks the candidates that pass: see
:mod:`layerlab.engine.fix_search`. Every run is bounded by a :class:`Budget`; a check that cannot be made
(no batch axis in the output, no time left) is listed in ``skipped`` and never counts as a pass
against a candidate that failed another.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch

#: Modules whose ``batch_first=False`` puts the batch on axis 1 of what they are given.
_SEQ_FIRST = (torch.nn.RNNBase, torch.nn.MultiheadAttention)  # (a Transformer's is its attention's)
#: Modules that act on each position alike: they say nothing about where the batch is.
_POSITIONWISE = (torch.nn.Embedding, torch.nn.Linear, torch.nn.LayerNorm, torch.nn.Dropout,
                 torch.nn.Identity, torch.nn.ReLU, torch.nn.GELU, torch.nn.Tanh, torch.nn.SiLU)
#: Ops whose presence in the original code claims causality.
_CAUSAL_OPS = {"triu", "tril", "triu_", "tril_"}


class Budget:
    """A time cap counted in this process's CPU time, so that what gets checked does not depend on
    how busy the machine is, with a wall-clock backstop (``WALL_FACTOR`` times as long): nothing hangs."""

    WALL_FACTOR = 4.0

    def __init__(self, seconds: float) -> None:
        self.cpu = time.process_time() + seconds
        self.wall = time.perf_counter() + self.WALL_FACTOR * seconds

    def over(self) -> bool:
        return time.process_time() > self.cpu or time.perf_counter() > self.wall

    def left(self) -> float:
        return max(0.0, min(self.cpu - time.process_time(), (self.wall - time.perf_counter()) / self.WALL_FACTOR))


@dataclass
class Verdict:
    """What the oracles found for one fixed copy: ``failed`` holds ``(oracle, sentence)`` pairs."""

    failed: List[Tuple[str, str]] = field(default_factory=list)
    passed: List[str] = field(default_factory=list)
    skipped: List[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed


@dataclass
class Inputs:
    """The model's top-level inputs, with the axis each one holds the batch on (``None``: unbatched)."""

    args: tuple
    kwargs: dict
    batch: int
    axes: Dict[Any, Optional[int]]

    def tensors(self):
        for i, a in enumerate(self.args):
            if isinstance(a, torch.Tensor):
                yield i, a
        for k, a in self.kwargs.items():
            if isinstance(a, torch.Tensor):
                yield k, a

    def replace(self, changes: Dict[Any, torch.Tensor]) -> Tuple[tuple, dict]:
        args = tuple(changes.get(i, a) for i, a in enumerate(self.args))
        kwargs = {k: changes.get(k, a) for k, a in self.kwargs.items()}
        return args, kwargs



def parameter_sizes(module) -> set:
    """Every size of every initialised parameter (a lazy module's that never ran has no shape yet)."""
    from torch.nn.parameter import is_lazy

    return {int(s) for p in module.parameters() if not is_lazy(p) for s in p.shape}


def batch_axis(model: torch.nn.Module, failed_at: str = "") -> int:
    """Axis 1 when the first axis-aware module of ``model`` is seq-first (an RNN, a
    MultiheadAttention left ``batch_first=False``); else axis 0. Read from the *original* model: a
    fix that flips ``batch_first`` must not move the axis it is judged on. The module that raised
    (``failed_at``) is no evidence: its ``batch_first`` may be the mistake."""
    for name, m in model.named_modules():
        if isinstance(m, (torch.nn.Transformer, torch.nn.TransformerEncoder, torch.nn.TransformerDecoder,
                          torch.nn.TransformerEncoderLayer, torch.nn.TransformerDecoderLayer)):
            continue  # their attention inside says it
        if failed_at and f"{name or '(root)'} (" in failed_at:
            return 0
        if isinstance(m, _SEQ_FIRST):
            return 0 if getattr(m, "batch_first", False) else 1
        if not list(m.children()) and not isinstance(m, _POSITIONWISE):
            return 0
    return 0


def model_inputs(original: torch.nn.Module, args: tuple, kwargs: dict, failed_at: str = "") -> Optional[Inputs]:
    """The inputs with their batch axes, or ``None`` when no tensor input has one. The batch axis of
    the first input is the one whose size the most inputs share (an RNN's ``h0`` holds the batch
    too); on a tie, the one the first axis-aware module reads (:func:`batch_axis`)."""
    tensors = [a for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor)]
    default = batch_axis(original, failed_at)
    first = next((t for t in tensors if t.dim() > 0), None)
    if first is None:
        return None

    def votes(axis):
        return sum(first.shape[axis] in t.shape for t in tensors) if first.dim() > axis else -1
    axis = max([default] + [a for a in (0, 1) if a != default], key=votes)
    b = first.shape[axis]
    found = Inputs(args, kwargs, b, {})
    for key, t in found.tensors():
        if t.dim() > axis and t.shape[axis] == b:
            found.axes[key] = axis
        else:
            found.axes[key] = next((d for d in range(t.dim()) if t.shape[d] == b), None)
    return found


def batch_blocked(inputs: Inputs, steps=()) -> Optional[str]:
    """Why the batch cannot be grown or perturbed sample by sample, or ``None``: integer inputs
    without the batch axis (offsets, an edge list, indices into the samples: the samples are mixed
    or cut by design), or a fix that adds the batch axis (the inputs have none)."""
    for s in steps:
        if s.kind == "reshape-input" and s.params.get("op") == "unsqueeze" and s.params.get("dim") == 0:
            return "the inputs have no batch axis (the fix adds one)"
    for key, t in inputs.tensors():
        if inputs.axes[key] is None and t.dim() > 0 and not (t.is_floating_point() or t.is_complex()) \
                and t.dtype != torch.bool:
            return f"{_name(key)} {list(t.shape)} holds integers without the batch axis (offsets, edges, indices)"
    return None


def _other_values(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Different values of the same kind: floats drawn anew, ids within the ids' range, masks kept."""
    if t.dtype == torch.bool:
        return t.clone()
    if t.is_complex():
        return t.detach().flip(list(range(t.dim()))).requires_grad_(t.requires_grad)
    if t.is_floating_point():  # drawn within the values' own range: data in [0, 1) stays there
        low, high = float(t.detach().min()), float(t.detach().max())
        if high - low < 1e-6:
            low, high = low - 1.0, high + 1.0
        fresh = torch.rand(t.shape, generator=gen, dtype=torch.float32).to(t.device, t.dtype)
        return (low + fresh * (high - low)).requires_grad_(t.requires_grad)
    low, high = int(t.min()), int(t.max())
    return torch.randint(low, high + 1, t.shape, generator=gen, dtype=t.dtype).to(t.device)


def _grow(t: torch.Tensor, axis: int, new: int) -> torch.Tensor:
    """``t`` with ``new`` entries on ``axis`` (repeating what is there: valid ids and masks stay valid)."""
    reps = -(-new // t.shape[axis])
    grown = torch.cat([t.detach()] * reps, dim=axis).narrow(axis, 0, new)
    return grown.requires_grad_(t.requires_grad) if grown.is_floating_point() else grown


def _outputs(value: Any) -> List[torch.Tensor]:
    from layerlab.probe.hooks import flatten

    return [v for _, v in flatten(value, "") if isinstance(v, torch.Tensor)]


def _run(model, args, kwargs, seed):
    from layerlab.target.seeding import seeded

    with seeded(seed, model, [*args, *kwargs.values()]):
        return model(*args, **kwargs)


def _where_it_fails(model, args, kwargs, seed, with_context: bool = False):
    """``None`` when ``model`` runs on these inputs, else where it raised (module path, op line);
    ``(where, failure context)`` with ``with_context``."""
    from layerlab.probe.verify_fix import location, traced_forward

    fixed_subs = getattr(model, "substitutions", None)
    inner = getattr(model, "model", model) if fixed_subs is not None else model
    with torch.no_grad():
        outcome = traced_forward(inner, args, kwargs, seed, fixed_subs)
    where = None if outcome.ok else location(outcome.ctx)
    return (where, outcome.ctx) if with_context else where


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape:
        return False
    if not (a.is_floating_point() or a.is_complex()):
        return bool(torch.equal(a, b))
    a, b = a.detach().double(), b.detach().double()
    scale = float(a.abs().nan_to_num(0).max()) if a.numel() else 0.0
    return bool(torch.allclose(a, b, rtol=1e-4, atol=1e-5 * max(scale, 1.0), equal_nan=True))


# -- the oracles ------------------------------------------------------------------------------------
def runs_backward(fixed, args, kwargs, seed) -> Optional[str]:
    """``None`` when forward and backward run, else why not (no differentiable output: ``None``)."""
    try:
        outs = [o for o in _outputs(_run(fixed, args, kwargs, seed)) if o.requires_grad and o.is_floating_point()]
        if not outs:
            return None
        gen = torch.Generator().manual_seed(0)
        loss = sum((o * torch.rand(o.shape, generator=gen).to(o.device, o.dtype)).sum() for o in outs)
        loss.backward()
    except Exception as exc:  # noqa: BLE001 - the candidate's own failure is the finding
        return f"the backward raises {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    finally:
        fixed.zero_grad(set_to_none=True)
    return None


def batch_independent(fixed, inputs: Inputs, seed) -> Optional[str]:
    """``None`` when sample 0's output ignores the other samples (eval mode), else the finding;
    ``"skip"`` when no output holds the batch."""
    if inputs.batch < 2:  # one sample: a second one is needed to see any mixing
        grown = {k: _grow(t, inputs.axes[k], 2) for k, t in inputs.tensors() if inputs.axes[k] is not None}
        args, kwargs = inputs.replace(grown)
        inputs = Inputs(args, kwargs, 2, inputs.axes)
    gen = torch.Generator().manual_seed(1)
    changed = {}
    for key, t in inputs.tensors():
        axis = inputs.axes[key]
        if axis is None or t.dtype == torch.bool:
            continue
        other = _other_values(t, gen)
        keep = torch.zeros(t.shape[axis], dtype=torch.bool)
        keep[0] = True
        shape = [1] * t.dim()
        shape[axis] = -1
        changed[key] = torch.where(keep.view(shape).to(t.device), t.detach(), other.detach())
    if not changed:
        return "skip"
    try:
        with torch.no_grad():
            before = _outputs(_run(fixed, inputs.args, inputs.kwargs, seed))
            args, kwargs = inputs.replace(changed)
            after = _outputs(_run(fixed, args, kwargs, seed))
    except Exception:  # noqa: BLE001 - it does not run with these samples: the sizes oracle says where
        return "skip"
    looked = False
    axis_in = next((a for a in inputs.axes.values() if a is not None), 0)
    for out_a, out_b in zip(before, after):
        axis = axis_in if out_a.dim() > axis_in and out_a.shape[axis_in] == inputs.batch else next(
            (d for d in range(out_a.dim()) if out_a.shape[d] == inputs.batch), None)
        if axis is None or out_a.shape != out_b.shape:
            continue
        looked = True
        if not _close(out_a.select(axis, 0), out_b.select(axis, 0)):
            return ("sample 0's output then depends on the other samples of the batch (with the other "
                    "samples changed and sample 0 kept, sample 0's output changes, in eval mode)")
    return None if looked else "skip"


def claims_causal(trace) -> bool:
    """The original code builds a causal mask (``triu``/``tril``) or asks for ``is_causal=True``."""
    for record in getattr(trace, "records", []) or []:
        if record.op in _CAUSAL_OPS or record.args.get("is_causal") is True:
            return True
    return False


def stays_causal(fixed, inputs: Inputs, free, seed) -> Optional[str]:
    """``None`` when output step t ignores input steps after t on the first free axis of a floating
    input (or ids) that the output keeps; else the finding."""
    for key, axis, size in free:
        t = dict(inputs.tensors())[key]
        cut = size // 2
        later = torch.arange(size, device=t.device) >= cut
        shape = [1] * t.dim()
        shape[axis] = -1
        other = _other_values(t, torch.Generator().manual_seed(2))
        changed = torch.where(later.view(shape), other.detach(), t.detach())
        with torch.no_grad():
            before = _outputs(_run(fixed, inputs.args, inputs.kwargs, seed))
            after = _outputs(_run(fixed, *inputs.replace({key: changed}), seed))
        for a, b in zip(before, after):
            if a.dim() > axis and a.shape[axis] == size and a.shape == b.shape:
                if not _close(a.narrow(axis, 0, cut), b.narrow(axis, 0, cut)):
                    return f"the model is no longer causal: output step {cut - 1} reads input steps from {cut} on"
                return None
    return None


def _name(key) -> str:
    return f"input {key}" if isinstance(key, int) else f"`{key}`"


def judge(fixed, original: torch.nn.Module, args: tuple, kwargs: dict, seed, *, failed_at: str,
          edited: set, trace=None, budget_s: float = 2.0, free=None, resized=None, steps=(),
          flattened=None) -> Verdict:
    """Run every oracle on ``fixed`` (a FixedModel); ``original`` is the user's model (never run,
    only copied), ``failed_at`` where it failed, ``edited`` the module paths and op sites the fix
    changed; ``free``: the original's free axes when already known."""
    from layerlab.engine.oracle_sizes import free_axes, other_sizes

    start = time.perf_counter()
    deadline = Budget(budget_s)
    verdict = Verdict()
    mode = fixed.training
    problem = runs_backward(fixed, args, kwargs, seed)
    (verdict.failed.append(("backward", problem)) if problem else verdict.passed.append("backward"))
    inputs = model_inputs(original, args, kwargs, failed_at)
    blocked = batch_blocked(inputs, steps) if inputs is not None else None
    fixed.eval()
    try:
        if inputs is None or blocked:
            verdict.skipped += ["batch", "sizes"] + ([blocked] if blocked else [])
        elif not verdict.failed:
            if free is None:
                params = parameter_sizes(original)
                free = free_axes(original, inputs, seed, failed_at, params, deadline)
            problem, notes = other_sizes(fixed, inputs, free, seed, edited, deadline, resized, flattened)
            (verdict.failed.append(("sizes", problem)) if problem else verdict.passed.append("sizes"))
            verdict.skipped += notes
            problem = batch_independent(fixed, inputs, seed) if not verdict.failed else "skip"
            if problem == "skip":
                verdict.skipped.append("batch")
            elif problem:
                verdict.failed.append(("batch", problem))
            else:
                verdict.passed.append("batch")
            if trace is not None and claims_causal(trace) and not verdict.failed:
                problem = stays_causal(fixed, inputs, free, seed)
                (verdict.failed.append(("causal", problem)) if problem else verdict.passed.append("causal"))
    except Exception as exc:  # noqa: BLE001 - an oracle that cannot run is not a pass
        verdict.skipped.append(f"the checks stopped: {type(exc).__name__}: {str(exc)[:120]}")
    finally:
        fixed.train(mode)
    verdict.seconds = time.perf_counter() - start
    return verdict


def first_problem(verdict: Verdict) -> Optional[str]:
    """``runs, but …``: the first oracle that failed, as one clause."""
    return verdict.failed[0][1] if verdict.failed else None

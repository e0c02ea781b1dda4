"""The checks a fixed loss must pass before its fix is called verified (see :mod:`layerlab.probe.loss_failure`).

A fix of a loss that raised is re-run as forward + loss on a copy. That it runs is not enough: a
``(B, 1)`` prediction minus a ``(B,)`` target runs, and pairs every sample with every other. So the
fixed loss must be

* **finite**: a finite scalar;
* **backward**: autograd's backward through it runs and gives finite gradients to the copy's parameters;
* **batch**: no op of the loss pairs the samples (one operand holding the batch on one axis, the other on
  another, the output keeping both), and sample 0's gradient does not move when the other samples'
  outputs do (each value is mixed with its neighbour in the output, so it stays in the output's range: a
  probability stays one). A mean over per-sample terms passes; a softmax over the batch does not. Run
  when the output is one floating tensor with exactly one axis of the batch's size.

The tolerance is the oracles' (:func:`layerlab.engine.oracles._close`): one policy.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from layerlab.probe.report import Verification


def judge(fixed, module, inputs, kwargs, seed, outcome, steps, then) -> Verification:
    """``runs`` when the fixed loss is a finite scalar, backward runs, and the samples stay independent;
    else ``implausible`` with the check that failed."""
    from layerlab.probe.hooks import flatten

    value = outcome.value
    shapes = [list(t.shape) for _, t in flatten(outcome.output) if isinstance(t, torch.Tensor)]
    done = Verification("runs", steps, then, outputs=shapes)  # the model's output shapes, as for a forward fix
    problem = _finite(value) or _pairs_samples(outcome, module, inputs, kwargs)
    if problem is None:
        problem = _backward(fixed, value)
        if problem is None:
            done.checks.append("backward")
    if problem is None:
        problem = _batch_coupled(fixed, module, inputs, kwargs, seed, outcome.output)
        if problem is None:
            done.checks.append("batch")
        elif problem is NOT_JUDGED:
            problem = None
    if problem is not None:
        done.status, (done.failed_check, done.note) = "implausible", problem
    return done


def _finite(value: torch.Tensor):
    if value.is_floating_point() and not bool(torch.isfinite(value.detach()).all()):
        return "finite", f"the loss is then {float(value.detach())}"
    return None


def _backward(fixed, value: torch.Tensor):
    params = [p for p in fixed.model.parameters() if p.requires_grad]
    if not value.requires_grad or not params:
        return None
    try:
        grads = torch.autograd.grad(value, params, allow_unused=True)
    except Exception as exc:  # noqa: BLE001 - what the fixed loss's backward raises is the verdict
        return "backward", f"backward then raises {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    if any(g is not None and g.is_floating_point() and not bool(torch.isfinite(g).all()) for g in grads):
        return "backward", "backward then gives non-finite gradients"
    return None


def _batch_size(module, inputs, kwargs, output) -> Optional[Tuple[int, int]]:
    """``(batch size, the output's axis of that size)`` when the output is one floating tensor with
    exactly one axis of the batch's size (else the batch check is not run)."""
    from layerlab.engine.oracles import model_inputs

    if not isinstance(output, torch.Tensor) or not output.is_floating_point():
        return None
    found = model_inputs(module, tuple(inputs), dict(kwargs))
    if found is None or found.batch < 2:
        return None
    axes = [d for d in range(output.dim()) if output.shape[d] == found.batch]
    return (found.batch, axes[0]) if len(axes) == 1 else None


#: What :func:`_batch_coupled` says when it cannot judge (no single batch axis, a loss that refuses the
#: mixed values): the check is then not listed as passed.
NOT_JUDGED = ("batch", "not judged")


def _batch_coupled(fixed, module, inputs, kwargs, seed, output):
    """Sample 0's gradient of the fixed loss must not move when the other samples' outputs do (a mean
    over per-sample terms): a fix that mixes the samples fails here. ``None``: it passed."""
    from layerlab.engine.oracles import _close

    found = _batch_size(module, inputs, kwargs, output)
    if found is None:
        return NOT_JUDGED
    _, axis = found
    o = output.detach()
    shuffled = o.reshape(-1).roll(1).view_as(o)  # each value mixed with its neighbour's: never the same tensor
    others = torch.ones(o.shape[axis], dtype=torch.bool)
    others[0] = False
    shape = [1] * o.dim()
    shape[axis] = o.shape[axis]
    mixed = torch.where(others.view(shape).to(o.device), 0.5 * o + 0.5 * shuffled, o)  # within o's range
    if torch.equal(mixed, o):  # constant outputs: nothing to move
        return NOT_JUDGED
    try:
        first = _grad_at(fixed, o)
        second = _grad_at(fixed, mixed)
    except Exception:  # noqa: BLE001 - a loss that refuses the mixed values (a check it makes): not judged
        return NOT_JUDGED
    if first is None or second is None:
        return NOT_JUDGED
    if not _close(first.select(axis, 0), second.select(axis, 0)):
        return "batch", "sample 0's gradient then depends on the other samples' outputs"
    return None


def _grad_at(fixed, output: torch.Tensor) -> Optional[torch.Tensor]:
    from layerlab.probe.loss_failure import _fixed_context

    o = output.detach().clone().requires_grad_(True)
    with _fixed_context(fixed.model, fixed.loss_modules, fixed.substitutions, tuple(fixed.module_fixes)):
        value = fixed.loss(o)
    if not isinstance(value, torch.Tensor) or not value.requires_grad:
        return None
    (grad,) = torch.autograd.grad(value, o, allow_unused=True)
    return grad


def _pairs_samples(outcome, module, inputs, kwargs):
    """An op of the fixed loss that pairs every sample with every other: one operand holds the batch on one
    axis, the other on another (``(B, 1) − (B,)`` → ``(B, B)``), and the output keeps both."""
    from layerlab.engine.oracles import model_inputs

    found = model_inputs(module, tuple(inputs), dict(kwargs))
    if found is None or found.batch < 2 or outcome.records is None:
        return None
    b = found.batch
    for record in outcome.records:
        if len(record.inputs) < 2 or not record.outputs:
            continue
        rank = len(record.outputs[0])
        aligned = [[1] * (rank - len(o.shape)) + list(o.shape) for o in record.inputs if len(o.shape) <= rank]
        axes = [{d for d, s in enumerate(shape) if s == b} for shape in aligned]
        out_axes = {d for d, s in enumerate(record.outputs[0]) if s == b}
        for i, a in enumerate(axes):
            for c in axes[i + 1:]:
                if any(x != y and x in out_axes and y in out_axes and x not in c and y not in a for x in a for y in c):
                    return "batch", (f"`{record.op}`{' at ' + record.source if record.source else ''} then pairs every "
                                     f"sample with every other ({' and '.join(str(o.shape) for o in record.inputs[:2])} → "
                                     f"{record.outputs[0]})")
    return None

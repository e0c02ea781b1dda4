"""The sizes oracle: does the fixed copy run at other sizes of every *free* axis of its inputs?

A free axis is one the original model did not tie to a size before it failed: the batch, and each
sequence or spatial axis that, grown to twice its size, still reaches the same failure (and that is
not the failing layer's own features axis, nor a size some parameter has). The fixed copy must run
at batch + 1 and at each free axis doubled, with the output's batch axis following; failing again
at a layer or op the fix changed means the fix tied a parameter to that size. Two ties are by
design and only noted: an image's spatial size (a classifier's ``Linear`` after ``Flatten``), and
a flattened length that a layer was already built for (a text CNN's ``Linear(C·L)``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from layerlab.engine.oracles import (Budget, Inputs, _grow, _name, _outputs, _run, _where_it_fails, model_inputs,
                                     parameter_sizes)


def _consumed_axis(module) -> Optional[int]:
    """The axis of its input a layer reads as features (``None``: not known, or an op)."""
    if isinstance(module, (torch.nn.Linear, torch.nn.LayerNorm, torch.nn.RNNBase, torch.nn.MultiheadAttention)):
        return -1
    if isinstance(module, (torch.nn.modules.conv._ConvNd, torch.nn.modules.batchnorm._NormBase, torch.nn.GroupNorm)):
        return 1
    return None


def _feeds_the_failing_layer(base, ctx) -> bool:
    """At the other size the failing layer's features axis changed, and no flatten merged it there:
    the axis *is* that layer's features (a raw input's channels), not a free axis."""
    if base is None or ctx is None or base.failed_op is not None or base.module is None:
        return False
    axis = _consumed_axis(base.module)
    before, after = base.tensors(), ctx.tensors()
    if axis is None or not before or not after or before[0].dim() != after[0].dim() or before[0].dim() == 0:
        return False
    return before[0].shape[axis] != after[0].shape[axis] and base.path not in flattened_inputs(base)


def free_axes(original, inputs: Inputs, seed, failed_at: str, param_sizes: set,
              deadline: Budget, base=None) -> List[Tuple[Any, int, int]]:
    """``(input key, axis, size)`` of the sequence/spatial axes the original model did not tie to a
    size before its failure: at twice the size it still fails at ``failed_at`` (or runs). Axes whose
    size equals a parameter's size (channels, features, a vocabulary) and an image's channel axis
    are never free: the layer that raised may be their first reader."""
    from layerlab.probe.verify_fix import copy_model

    found = []
    for key, t in inputs.tensors():
        if t.dtype == torch.bool:
            continue
        image = t.is_floating_point() and t.dim() in (4, 5)
        for axis in range(t.dim()):
            size = t.shape[axis]
            if axis == inputs.axes[key] or size < 2 or size in param_sizes or deadline.over():
                continue
            if image and axis == 1:  # (N, C, H, W …): the channels are the model's, never free
                continue
            grown = _resize_all(inputs, size, 2 * size, skip_batch=True, only=(key, axis))
            clone = copy_model(original, "eval")
            if clone is None:
                return found
            where, ctx = _where_it_fails(clone, *inputs.replace(grown), seed, with_context=True)
            if where is None or (where == failed_at and not _feeds_the_failing_layer(base, ctx)):
                found.append((key, axis, size))
    return found


def _resize_all(inputs: Inputs, size: int, new: int, skip_batch: bool, only=None) -> Dict[Any, torch.Tensor]:
    """Every input axis of ``size`` (the same free axis as ``only`` where inputs share it) grown to ``new``."""
    changes = {}
    for key, t in inputs.tensors():
        axes = [d for d in range(t.dim()) if t.shape[d] == size and not (skip_batch and d == inputs.axes[key])]
        if only is not None and key == only[0]:  # the axis itself; other inputs follow where they share it
            axes = [only[1]]
        for d in axes:
            t = _grow(t, d, new)
        if axes:
            changes[key] = t
    return changes


def _failure_at(model, args, kwargs, seed) -> Tuple[str, Optional[int]]:
    """Where ``model`` fails on these inputs, and the last size of the failing layer's first input."""
    from layerlab.probe.verify_fix import location, traced_forward

    with torch.no_grad():
        outcome = traced_forward(model.model, args, kwargs, seed, model.substitutions)
    if outcome.ok or outcome.ctx is None:
        return "?", None
    xs = outcome.ctx.tensors()
    return location(outcome.ctx), (int(xs[0].shape[-1]) if xs and xs[0].dim() else None)


def _flattened_by_design(resized: Dict[str, Tuple[str, int, int]], where: str, flattened: set) -> Optional[str]:
    """A layer fed a flattened map or sequence and built for a flattened size already (a text CNN's
    ``Linear(C·L)`` one conv window off, a patch head one patch short): its old size is 2 or more
    times one of the flattened axes' sizes, so its design fixes the length; the fix re-sizes it for
    this one. Said, not failed. ``in_features = C`` becoming ``T·C`` (old = 1·C) is not."""
    for path, (name, old, value) in resized.items():
        merged = flattened.get(path, ()) if isinstance(flattened, dict) else ()
        if where.startswith(f"{path} (") and any(m > 1 and old % m == 0 and old // m >= 2 for m in merged):
            return (f"fixed length by design: `{path}` reads a flattened input and was built for {old} "
                    f"features, a multiple of the flattened axes; {name}={value} sizes it for this length")
    return None


def other_sizes(fixed, inputs: Inputs, free: Sequence[Tuple[Any, int, int]], seed, edited: set,
                deadline: Budget, resized: Optional[Dict[str, Tuple[str, int, int]]] = None,
                flattened: Optional[set] = None) -> Tuple[Optional[str], List[str]]:
    """``(finding, notes)``: the fixed copy at batch + 1 and at twice each free axis's size.
    ``resized``: ``path → (argument, old size, new size)`` of the layers the fix rebuilt;
    ``flattened``: the layers whose input a flatten made, with the merged sizes (:func:`flattened_inputs`)."""
    resized = resized or {}
    notes: List[str] = []
    grown = {k: _grow(t, inputs.axes[k], inputs.batch + 1) for k, t in inputs.tensors() if inputs.axes[k] is not None}
    trials = [("the batch", inputs.batch, inputs.batch + 1, grown, False)]
    tensors = dict(inputs.tensors())
    spatial = {t.shape[d] for t in tensors.values() if t.is_floating_point() and t.dim() in (4, 5)
               for d in range(2, t.dim())}
    for key, axis, size in free:
        image = size in spatial  # an image's H/W, or a label mask's that shares them
        trials.append((f"axis {axis} of {_name(key)}", size, 2 * size, _resize_all(inputs, size, 2 * size, True, (key, axis)),
                       image))
    for label, size, new, changes, image in trials:
        if deadline.over():
            notes.append(f"{label}: not tried (time cap)")
            continue
        args, kwargs = inputs.replace(changes)
        try:
            with torch.no_grad():
                outs = _outputs(_run(fixed, args, kwargs, seed))
        except Exception:  # noqa: BLE001 - where it failed decides whether the fix is to blame
            if label != "the batch" and _runs_with_every_axis_of(fixed, inputs, size, new, seed):
                continue  # the axis had a twin of its size in the same tensor (a (T, T) mask): both grow
            where, _ = _failure_at(fixed, args, kwargs, seed)
            if any(site and site in where for site in edited):
                design = _flattened_by_design(resized, where, flattened or set())
                if design:
                    notes.append(design)
                    continue
                if label == "the batch":
                    return (f"at batch {new} (not {size}) it fails again at {where}: the fix only works for a "
                            f"batch of {size}"), notes
                if image:  # an image classifier sized for one image size is common by design: said, not failed
                    notes.append(f"fixed image size: at {label} = {new} it fails at {where} (the fix sizes it "
                                 f"for {size})")
                    continue
                return (f"at another size of {label} ({size} → {new}) it fails again at {where}: the fix ties a "
                        f"parameter to the size {size}"), notes
            notes.append(f"at {label} = {new} it fails at {where}, which the fix did not change")
            continue
        if label == "the batch" and outs and not any(new in o.shape for o in outs) and any(size in o.shape for o in outs):
            return f"at batch {new} the output's batch axis stays {size}: the output does not follow the batch", notes
    return None, notes


def _runs_with_every_axis_of(fixed, inputs: Inputs, size: int, new: int, seed) -> bool:
    """Does the fixed copy run when every non-batch axis of ``size``, in every input, grows to ``new``?
    A square (T, T) attention mask grown on one axis alone is no size any model accepts; grown on
    both it is the other length the free axis stands for."""
    args, kwargs = inputs.replace(_resize_all(inputs, size, new, skip_batch=True))
    try:
        with torch.no_grad():
            _run(fixed, args, kwargs, seed)
    except Exception:  # noqa: BLE001 - a failure here leaves the single-axis verdict standing
        return False
    return True


_FLATTENS = {"flatten", "view", "reshape"}


def flattened_inputs(ctx) -> Dict[str, Tuple[int, ...]]:
    """``{path: sizes of the merged axes}`` for the failing layer when its input was made by merging
    axes (``flatten``, ``view``/``reshape`` to a lower rank, an ``nn.Flatten``); else ``{}``."""
    xs = ctx.tensors() if ctx is not None and ctx.module is not None and ctx.failed_op is None else []
    if not xs:
        return {}
    op_index, call_index = ctx.made_by(xs[0])
    record = ctx.op(op_index)
    if record is not None:
        if record.op in _FLATTENS and record.inputs and record.outputs and \
                len(record.outputs[0]) < len(record.inputs[0].shape):
            return {ctx.path: tuple(record.inputs[0].shape[1:])}
        return {}
    call = ctx.call(call_index)
    if call is not None and call.class_name == "Flatten" and call.tensor_inputs:
        return {ctx.path: tuple(call.tensor_inputs[0].shape[1:])}
    return {}


def original_free_axes(original, args, kwargs, seed, base, deadline: Budget):
    """:func:`free_axes` of the original model's inputs, ``base`` its failure's context (computed
    once per failure, shared by every candidate's judgement)."""
    from layerlab.probe.verify_fix import location

    failed_at = location(base)
    inputs = model_inputs(original, args, kwargs, failed_at)
    if inputs is None:
        return []
    params = parameter_sizes(original)
    return free_axes(original, inputs, seed, failed_at, params, deadline, base)

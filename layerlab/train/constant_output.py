"""A prediction that is the same for every sample in the batch: the model ignores its input.

When every row of the prediction (along the batch dimension, dim 0) is equal at the first step and
still at the last, while the target's rows differ, the loss can at best fit the target's mean: the
model is not reading what tells the samples apart. Seen, not guessed — and said only when the loss
did not overfit. "Equal" is within :data:`ROW_RTOL` (1e-6) of the tensor's largest magnitude, not
bit-exact: a batched matmul may give identical rows results that differ in the last bit (1 ulp of
float32 is 1.2e-7 relative), and a check that depended on that would come and go with the kernel.
Integer tensors (token ids) are compared exactly.

The cause is the user's forward; layerlab names what it sees and the usual suspects: a sequence read
at a position where every sample holds the same token (``output[:, 0]`` after a BOS token in a
causal model), an all-padding batch, zero weights, an input that is never used.

When every batched input is the same for every sample too, nothing tells the samples apart: the data's
doing, a warning (also when the loss fell to the floor of a constant prediction, see :mod:`~.floor`).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch

from layerlab.errors import Problem

__all__ = ["ROW_RTOL", "rows_equal", "rows_equal_any", "same_inputs", "finding"]

#: rows closer than this share of the tensor's largest magnitude count as equal (about 8 float32 ulps)
ROW_RTOL = 1e-6


def rows_equal_any(t: torch.Tensor) -> bool:
    """Every sample (row along dim 0) of a tensor of any dtype is the same: exactly for integers and
    bools, within :data:`ROW_RTOL` of the largest magnitude for floating and complex tensors."""
    rows = t.detach().reshape(t.shape[0], -1)
    if not (rows.is_floating_point() or rows.is_complex()) or rows.numel() == 0:
        return bool((rows == rows[:1]).all())
    if not bool(torch.isfinite(rows).all()):
        return bool((rows == rows[:1]).all())
    scale = float(rows.abs().max())
    return bool(((rows - rows[:1]).abs() <= ROW_RTOL * scale).all())


def rows_equal(pred: Any) -> bool:
    """Every sample's prediction is the same (a floating tensor, a batch of at least 2)."""
    if not isinstance(pred, torch.Tensor) or pred.dim() == 0 or pred.shape[0] < 2 or not pred.is_floating_point():
        return False
    return rows_equal_any(pred)


def same_inputs(inputs: Sequence[Any], batch: int) -> bool:
    """Every batched input (a tensor whose dim 0 is ``batch``) is the same for every sample."""
    batched = [t for t in inputs if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == batch]
    return bool(batched) and all(rows_equal_any(t) for t in batched)


def finding(seen: List[bool], objective: Any, verdict: str, equal_inputs: bool = False) -> Optional[Problem]:
    """``equal_inputs``: every batched argument of forward is the same for every sample
    (:func:`same_inputs`): nothing tells the samples apart, and an equal prediction is no fault of the
    model: a warning that says so."""
    target = getattr(objective, "target", None)
    if len(seen) < 2 or not all(seen) or not isinstance(target, torch.Tensor) \
            or target.dim() == 0 or target.shape[0] < 2 or rows_equal_any(target):
        return None
    if equal_inputs:  # the data, not the model, makes them equal
        return Problem("constant-output", f"every sample of the batch has the same input, so the prediction "
                       f"({objective.output_path}) is the same for all while the target differs: the loss can at "
                       "best fit the target's mean", where=objective.output_path, severity="warning",
                       hint="give the check a batch whose samples differ (a random input: shape: without fill)")
    if verdict == "overfits":
        return None
    return Problem("constant-output", f"the prediction ({objective.output_path}) is the same for every sample (within "
                   f"{ROW_RTOL:g} of its largest value) "
                   "of the batch, at the first step and at the last, while the target differs between samples: the "
                   "model ignores what tells the samples apart, so the loss can at best fit the target's mean",
                   where=objective.output_path, severity="error",
                   hint="check what forward reads: a sequence read at a position every sample shares (output[:, 0] "
                        "after a BOS token: read the last real token), an all-padding batch, zero weights, an input "
                        "that is never used")

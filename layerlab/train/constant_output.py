"""A prediction that is the same for every sample in the batch: the model ignores its input.

When every row of the prediction (along the batch dimension, dim 0) is exactly equal at the first
step and still at the last, while the target's rows differ, the loss can at best fit the target's
mean: the model is not reading what tells the samples apart. Seen, not guessed — exact equality of
the rows — and said only when the loss did not overfit. The cause is the user's forward; layerlab
names what it sees and the usual suspects: a sequence read at a position where every sample holds
the same token (``output[:, 0]`` after a BOS token in a causal model), an all-padding batch, zero
weights, an input that is never used.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch

from layerlab.errors import Problem

__all__ = ["rows_equal", "finding"]


def rows_equal_any(t: torch.Tensor) -> bool:
    """Every sample (row along dim 0) of a tensor of any dtype is the same."""
    rows = t.detach().reshape(t.shape[0], -1)
    return bool((rows == rows[:1]).all())


def rows_equal(pred: Any) -> bool:
    """Every sample's prediction is exactly the same (a batch of at least 2)."""
    if not isinstance(pred, torch.Tensor) or pred.dim() == 0 or pred.shape[0] < 2 or not pred.is_floating_point():
        return False
    rows = pred.detach().reshape(pred.shape[0], -1)
    return bool((rows == rows[:1]).all())


def finding(seen: List[bool], objective: Any, verdict: str, inputs: Sequence[Any] = ()) -> Optional[Problem]:
    """``inputs``: the forward's arguments. When every batched one is the same for every sample, nothing
    tells the samples apart and an equal prediction is no fault of the model: a warning that says so."""
    target = getattr(objective, "target", None)
    if len(seen) < 2 or not all(seen) or verdict == "overfits" or not isinstance(target, torch.Tensor) \
            or target.dim() == 0 or target.shape[0] < 2:
        return None
    rows = target.reshape(target.shape[0], -1)
    if bool((rows == rows[:1]).all()):
        return None
    batched = [t for t in inputs if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == target.shape[0]]
    if batched and all(rows_equal_any(t) for t in batched):  # the data, not the model, makes them equal
        return Problem("constant-output", f"every sample of the batch has the same input, so the prediction "
                       f"({objective.output_path}) is the same for all while the target differs: the loss can at "
                       "best fit the target's mean", where=objective.output_path, severity="warning",
                       hint="give the check a batch whose samples differ (a random input: shape: without fill)")
    return Problem("constant-output", f"the prediction ({objective.output_path}) is exactly the same for every sample "
                   "of the batch, at the first step and at the last, while the target differs between samples: the "
                   "model ignores what tells the samples apart, so the loss can at best fit the target's mean",
                   where=objective.output_path, severity="error",
                   hint="check what forward reads: a sequence read at a position every sample shares (output[:, 0] "
                        "after a BOS token: read the last real token), an all-padding batch, zero weights, an input "
                        "that is never used")

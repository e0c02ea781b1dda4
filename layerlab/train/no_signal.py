"""A loss that gives the model nothing to learn from: every element masked away or ignored.

Three things a mask or an ignore index does when it removes *every* element, each seen, not guessed:

* **the loss is exactly 0 at every step and no parameter ever gets a non-zero gradient**
  (``(err * mask).sum() / mask.sum().clamp(min=1)`` with an all-zero mask): ``no-signal``, an
  error. fit.py would call a loss that starts at 0 "nothing to fall from"; with every gradient 0
  as well, nothing was trained at all, so that verdict is withdrawn. A loss with a floor of 0 that
  the model already reaches looks the same (a hinge/margin loss every sample already satisfies), so
  the loss function is first fed a few other predictions (the first one negated, scaled, noised):
  if any of them gives a non-zero loss, the loss does read the prediction and nothing is masked —
  the model already fits this batch, a warning (``already-fit``);
* **the loss is NaN at step 0**, before any update (so the learning rate cannot be the cause): the
  step is re-run under a ``TorchFunctionMode`` that watches ``cross_entropy``/``nll_loss`` for a
  target whose every element is ``ignore_index`` (a collator that set every label to -100: the
  mean over 0 elements is 0/0) and ``mean``/a division of a sum by a count that is 0;
* **an ``nn.Embedding`` whose every input index is its ``padding_idx``** (a tokenizer or collator
  bug: the batch is all padding): it returns the zero vector for every token, its gradient is
  exactly 0, and what follows sees a constant. Seen by a forward hook on one re-run forward. A batch
  that carries nothing for *one* input is also the data's doing (a segment embedding whose ids are
  all 0 in a single-segment batch, beside token ids that do differ): when the loss still overfits,
  falls or learns slowly while the samples' predictions differ, this is a warning. It is an error only
  when the loss did not overfit *and* the prediction is the same for every sample (what the
  all-padding embedding feeds is all the prediction sees), or, for a loss the model computes itself
  (no per-sample prediction to compare), when the loss did not fall at all.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from layerlab.errors import Problem
from layerlab.target.copying import copy_model

__all__ = ["zero_loss", "nan_at_start", "all_padding"]


def zero_loss(losses: List[float], nonzero_grad: List[bool], verdict: Any, objective: Any = None,
              pred: Any = None) -> Optional[Problem]:
    """``no-signal`` when the loss is 0 at every step and no gradient was ever non-zero; ``already-fit``
    (a warning) when the loss function does give other predictions a non-zero loss."""
    if not losses or any(v != 0.0 for v in losses) or any(nonzero_grad):
        return None
    verdict.verdict = "flat"
    if _reads_prediction(objective, pred):
        verdict.message = (f"the loss is exactly 0 at all {len(losses)} steps and every gradient is 0, but other "
                           "predictions get a non-zero loss: the model already fits this batch, so this run shows "
                           "nothing about learning")
        return Problem("already-fit", "the loss is exactly 0 from the first step and no gradient is ever non-zero, "
                       "yet a perturbed prediction gets a non-zero loss: nothing is masked away — the model's first "
                       "prediction is already at the loss's floor (a margin/hinge loss every sample satisfies)",
                       where="(loss)", severity="warning",
                       hint="to see it learn, give it a batch (or a target) it does not already fit")
    verdict.message = (f"the loss is exactly 0 at all {len(losses)} steps and every gradient is 0: "
                       "nothing is trained, so it shows nothing about overfitting")
    return Problem("no-signal", "the loss is exactly 0 from the first step and no parameter ever gets a non-zero "
                   "gradient: every element the loss counts is masked or weighted away", where="(loss)",
                   severity="error", hint="check the mask/weights the loss multiplies by (an all-zero mask, a "
                   "comparison on the wrong dtype, labels all ignored): at least one element must count")


def _reads_prediction(objective: Any, pred: Any) -> bool:
    """Some other prediction gets a finite non-zero loss (False when that cannot be tried)."""
    fn = getattr(objective, "fn", None)
    if fn is None or not isinstance(pred, torch.Tensor) or not pred.is_floating_point() or not pred.numel():
        return False
    p = pred.detach()
    scale = max(float(p.abs().max()), 1.0)
    noise = torch.randn(p.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float32).to(p)
    for other in (-p, p + scale * noise, scale * noise):
        try:
            with torch.no_grad():
                value = fn(other, objective.target)
            if isinstance(value, torch.Tensor) and value.numel() == 1 and bool(torch.isfinite(value)) and \
                    float(value) != 0.0:
                return True
        except Exception:  # evidence only: the run's own loss succeeded on the real prediction
            continue
    return False


class _Watch(TorchFunctionMode):
    """Records the first call that averages over nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.cause: Optional[Tuple[str, str]] = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.cause is None:
            self._look(func, args, kwargs)
        return func(*args, **kwargs)

    def _look(self, func, args, kwargs) -> None:
        if func in (F.cross_entropy, F.nll_loss):
            target = kwargs.get("target", args[1] if len(args) > 1 else None)
            ignore = kwargs.get("ignore_index", args[4] if len(args) > 4 else -100)
            reduction = kwargs.get("reduction", "mean")
            if isinstance(target, torch.Tensor) and not target.is_floating_point() and reduction == "mean" \
                    and target.numel() > 0 and bool((target == ignore).all()):
                self.cause = (f"{func.__name__}: every one of the {target.numel()} target elements is the "
                              f"ignore_index {ignore}, so its mean is over 0 elements (0/0 = NaN)",
                              f"the labels are all {ignore}: check the collator/label shift that builds them "
                              "(at least one label must be a real class)")
        elif func is torch.mean or func is torch.Tensor.mean:
            if isinstance(args[0], torch.Tensor) and args[0].numel() == 0:
                self.cause = ("a mean over an empty tensor (0 elements: NaN) — a mask that selected nothing",
                              "check the mask or index that selects the elements the loss averages")
        elif func in (torch.div, torch.Tensor.div, torch.Tensor.__truediv__):
            a, b = (args + (None, None))[:2]
            if all(isinstance(t, torch.Tensor) and t.dim() == 0 and t.is_floating_point() for t in (a, b)) \
                    and float(b) == 0.0 and float(a) == 0.0:
                self.cause = ("a sum divided by a count that is 0 (0/0 = NaN) — a mask whose sum is 0",
                              "the mask selects nothing: check how it is built, or clamp the count (min=1)")


def nan_at_start(model: torch.nn.Module, positional: list, keyword: Dict[str, Any], objective: Any
                 ) -> Tuple[Optional[str], str]:
    """Why the first step's loss is NaN (``None`` when not seen) and the hint; no update ran yet."""
    watch = _Watch()
    twin = copy_model(model)
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]), watch:
            out = twin(*positional, **keyword)
            if objective is not None:
                objective(out)
    except Exception:  # noqa: BLE001 — the run already failed; this is only a diagnosis
        pass
    if watch.cause is not None:
        return watch.cause
    return None, ("no update ran before this loss, so the learning rate is not the cause: look at this module's "
                  "inputs and arithmetic (a log of 0, a division by 0, a mask that selects nothing)")


def all_padding(model: torch.nn.Module, positional: list, keyword: Dict[str, Any], flags: List[Problem],
                verdict: str = "flat", same: Optional[List[bool]] = None) -> None:
    """Rewrite the ``zero-grad`` finding of an Embedding fed nothing but its ``padding_idx``. ``verdict``:
    the fit verdict; ``same``: whether the prediction was equal for every sample (first and last step)."""
    paths = {p: m for p, m in model.named_modules()
             if isinstance(m, torch.nn.Embedding) and m.padding_idx is not None}
    hits = [f for f in flags if f.code == "zero-grad" and f.where in paths]
    if not hits:
        return
    seen: Dict[str, bool] = {}
    twin = copy_model(model)
    twin_paths = {p: m for p, m in twin.named_modules() if p in paths}

    def hook(path):
        def record(module, inputs, _output):
            ids = inputs[0] if inputs else None
            if isinstance(ids, torch.Tensor):
                seen[path] = seen.get(path, True) and bool((ids == module.padding_idx).all())
        return record

    handles = [m.register_forward_hook(hook(p)) for p, m in twin_paths.items()]
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            twin(*positional, **keyword)
    except Exception:  # noqa: BLE001 — diagnosis only
        return
    finally:
        for h in handles:
            h.remove()
    constant = all(same) if same and len(same) >= 2 else None  # None: no per-sample prediction was compared
    # learning from other inputs: it overfits, falls or learns slowly while the samples' predictions differ (a
    # constant prediction that falls, or "overfits" down to the best constant's floor, only fits the target's
    # mean through a bias)
    learns = verdict in ("overfits", "falls", "slow") and constant is not True
    for f in hits:
        if seen.get(f.where):
            pad = paths[f.where].padding_idx
            f.message = (f"{f.where} (Embedding): every index in its input is its padding_idx {pad}, so it returns "
                         "the zero vector for every token and its gradient is exactly 0 — this batch is all padding "
                         "for this input")
            f.hint = (f"check the tokenizer/collator: real token ids must differ from the pad id {pad} "
                      "(or padding_idx is set to a real token's id)")
            if learns:
                f.message += (f"; the loss still {verdict if verdict != 'slow' else 'falls slowly'}, so the model "
                              "learns from its other inputs: the batch carries nothing for this one (a single-segment "
                              "batch does that)")
                f.severity = "warning"
            elif constant is False and verdict != "nonfinite":
                f.message += ("; the prediction still differs between samples, so other inputs reach it: this "
                              "embedding is not all the model sees, and the loss's failure to fit is not shown to "
                              "come from it")
                f.severity = "warning"
            else:
                f.severity = "error"

"""What the training steps minimise: the output the loss reads, the loss function and its target.

Three choices, each with a default a user can see in the report:

* **the output** (``output:``): the model may return a tuple, a dict or a Hugging Face
  ``ModelOutput``. An int picks a position, a name a key (``logits``); by default the loss reads the
  model's own ``loss`` entry when there is one (a Hugging Face model given ``labels``), else the
  first floating tensor in the output (``output[0]`` of an LSTM's ``(out, (h, c))``);
* **the loss** (``loss:``): ``mse``, ``cross_entropy``, ``nll``, ``model`` (the output *is* the
  loss: a scalar the model computed) or a callable ``loss(prediction, target) -> scalar`` (an import
  path in a spec; one outside torch needs ``--allow-import``). Default: ``model`` when the model
  returned a loss — its ``loss`` entry, or a floating *scalar* where the default rule would read
  (``forward`` returning ``F.cross_entropy(...)``, or a Hugging Face model with ``return_dict=False``
  returning ``(loss, logits, …)``): a scalar has no per-sample values a target could describe, so
  MSE against a random number would only train the loss towards that number — else ``mse``;
* **the target**: written like a spec input (``{shape: […]}``, ``{value: […]}``, ``{file: y.npy}``,
  ``{shape: [8], low: 0, high: 10}``, ``{same_as: x}``) or, by default, drawn from a seeded
  generator of its own (never the inputs' stream, so a target can't equal an input by accident):
  ``randn`` of the prediction's shape for ``mse``, class indices in ``[0, C)`` for
  ``cross_entropy``/``nll`` (classes on dim 1, as torch's losses read them) — also when the loss is
  given as torch's own function or module (``F.cross_entropy``, ``nn.CrossEntropyLoss(label_smoothing=0.1)``,
  ``nn.NLLLoss``) — and 0/1 labels for the binary cross-entropies (``nn.BCEWithLogitsLoss``): a
  random normal target would make those losses negative and unbounded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F

from layerlab.errors import Problem, SpecError, UsageError
from layerlab.target.bind import flatten

__all__ = ["LOSSES", "Objective", "pick_output", "make_target", "target_kind", "target_source", "loss_function",
           "target_seed", "negative_loss"]

#: loss names a spec or ``loss=`` may give (``model``: the model's output is its own loss)
LOSSES = ("mse", "cross_entropy", "nll", "model")
_FUNCTIONS = {"mse": F.mse_loss, "cross_entropy": F.cross_entropy, "nll": F.nll_loss}


@dataclass
class Objective:
    """The loss as it will be computed every step.

    Attributes:
        loss_name: ``mse``, ``cross_entropy``, ``nll``, ``model`` or the callable's name.
        output_path: the output the loss reads, as layerlab names outputs (``output[0]``, ``output['loss']``).
        fn: ``fn(prediction, target) -> scalar`` (``None`` for ``model``).
        target: the target tensor (``None`` for ``model``).
        target_source: how the target was made (``"random normal (seed 1)"``, ``"spec"``, ``"given"``).
        output_named: the user named the output (``output:``); False when layerlab's default rule picked it.
    """

    loss_name: str
    output_path: str
    fn: Optional[Callable[[Any, Any], Any]]
    target: Optional[torch.Tensor]
    target_source: str
    output_named: bool = True
    where: str = "loss"  #: what a loss that rejects the prediction or target is reported against (file:line:col)

    def __call__(self, output: Any) -> torch.Tensor:
        """The scalar loss of one forward's ``output``."""
        pred = select(output, self.output_path)
        if self.fn is None:
            return pred
        return self.fn(pred, self.target)


def target_seed(seed: int) -> int:
    """The target's own seed: derived from ``seed``, never equal to the inputs' stream."""
    return (seed * 1_000_003 + 0x7A5) % (2**63 - 1)


def _paths(output: Any) -> List[Tuple[str, torch.Tensor]]:
    if hasattr(output, "to_tuple") and not isinstance(output, dict):  # a ModelOutput that is not a dict
        output = dict(output.items())
    return flatten(output)


def select(output: Any, path: str) -> torch.Tensor:
    for p, t in _paths(output):
        if p == path:
            return t
    raise SpecError(f"the model's output has no {path} this step", where="output",
                    hint="the output's structure changed between steps; pick a fixed one with output:")


def pick_output(output: Any, choice: Union[None, int, str], where: str) -> Tuple[str, bool]:
    """``(path of the tensor the loss reads, whether it is the model's own loss)``.

    ``choice``: ``None`` (default rule, see the module docstring), an int (position in a tuple/list)
    or a name (a dict/``ModelOutput`` key, or a full path such as ``output[0][1]``).
    """
    paths = _paths(output)
    names = [p for p, _ in paths]
    if not paths:
        raise SpecError("the model returned no tensor for a loss to read", where=where,
                        got=type(output).__name__)
    if choice is None:
        own = "output['loss']"
        if own in names and _scalar(dict(paths)[own]):
            return own, True
        floats = [p for p, t in paths if t.is_floating_point() or t.is_complex()]
        first = (floats or names)[0]
        return first, _scalar(dict(paths)[first])  # a scalar where the prediction would be: the model's loss
    if isinstance(choice, bool) or not isinstance(choice, (int, str)):
        raise SpecError("output: picks one output by position (0) or name (logits)", where=where,
                        expected="an int or a name", got=choice)
    wanted = [f"output[{choice}]", f"output[{choice!r}]", str(choice)] if isinstance(choice, str) else \
        [f"output[{choice}]"]
    for w in wanted:
        match = [p for p in names if p == w]
        if match:
            return match[0], _scalar(dict(paths)[w])  # a scalar output, picked: the loss itself
    # output[0] of an LSTM is a tensor, output[1] a tuple: position 1 means its first tensor
    if isinstance(choice, int):
        nested = [p for p in names if p.startswith(f"output[{choice}][")]
        if nested:
            return nested[0], False
    raise SpecError(f"the model's output has no {choice!r}", where=where, expected=names, got=choice,
                    hint="give a position (0, 1) or a key (logits, loss) of what forward returns")


def _scalar(t: torch.Tensor) -> bool:
    return t.dim() == 0 and t.is_floating_point()


def loss_function(loss: Any, where: str) -> Tuple[str, Optional[Callable]]:
    """``loss`` (a name of :data:`LOSSES` or a callable) → ``(name, fn)``; ``fn`` is ``None`` for ``model``."""
    if callable(loss) and not isinstance(loss, str):
        if isinstance(loss, type) and issubclass(loss, torch.nn.Module):
            try:
                loss = loss()  # nn.MSELoss, nn.HuberLoss: the class, built with its defaults
            except Exception as exc:  # noqa: BLE001 - nn.Linear and the like need arguments: not a loss
                raise SpecError(f"the loss {loss.__name__} cannot be built without arguments "
                                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})",
                                where=where, expected="a loss module built with its defaults (torch.nn:MSELoss) "
                                "or a function fn(prediction, target) -> scalar", got=loss.__name__,
                                hint="name a loss: mse, cross_entropy, torch.nn.functional:huber_loss") from None
        return getattr(loss, "__name__", type(loss).__name__), loss
    if isinstance(loss, str) and loss.strip().startswith("torch.") and loss.strip().lower() not in LOSSES:
        # what a spec's train: section accepts (torch's own losses by path) works from Python too
        from layerlab.train.section import _loss

        return loss_function(_loss(loss, where, allow_import=False, base_dir=None), where)
    if not isinstance(loss, str) or loss.strip().lower() not in LOSSES:
        raise UsageError(f"unknown loss {loss!r}", where=where, expected=" | ".join(LOSSES) + " | a callable",
                         got=loss, hint="mse for regression, cross_entropy for class logits; from Python, pass "
                         "a loss function or module itself (F.huber_loss, nn.SmoothL1Loss)")
    name = loss.strip().lower()
    return name, _FUNCTIONS.get(name)


def target_kind(name: str, fn: Optional[Callable] = None) -> str:
    """What a loss compares the prediction with: ``classes`` (indices), ``binary`` (0/1) or ``values``."""
    import torch.nn as nn

    if name in ("cross_entropy", "nll") or fn in (F.cross_entropy, F.nll_loss) or \
            isinstance(fn, (nn.CrossEntropyLoss, nn.NLLLoss)):
        return "classes"
    if fn in (F.binary_cross_entropy, F.binary_cross_entropy_with_logits) or \
            isinstance(fn, (nn.BCELoss, nn.BCEWithLogitsLoss)):
        return "binary"
    return "values"


_SOURCES = {"classes": "random class indices", "binary": "random 0/1 labels", "values": "random normal"}


def target_source(kind: str, seed: int) -> str:
    """How :func:`make_target` made the default target, for the report."""
    return f"{_SOURCES[kind]} (seed {seed})"


def make_target(name: str, pred: torch.Tensor, seed: int, fn: Optional[Callable] = None) -> torch.Tensor:
    """The default target for loss ``name`` (``fn``) and prediction ``pred``, from its own seeded generator."""
    gen = torch.Generator().manual_seed(target_seed(seed))
    kind = target_kind(name, fn)
    if kind == "binary":
        labels = torch.randint(0, 2, tuple(pred.shape), generator=gen).to(torch.float32)
        return labels.to(device=pred.device, dtype=pred.dtype if pred.is_floating_point() else torch.float32)
    if kind == "classes":
        if pred.dim() == 0:
            raise SpecError(f"{name} reads class scores, but the prediction is a scalar", where="loss",
                            hint="pick the logits with output:, or use mse")
        classes = pred.shape[1] if pred.dim() > 1 else pred.shape[0]
        shape = (pred.shape[0], *pred.shape[2:]) if pred.dim() > 1 else ()
        return torch.randint(0, classes, shape, generator=gen).to(pred.device)
    real = pred.dtype if pred.is_floating_point() else torch.float32
    return torch.randn(tuple(pred.shape), generator=gen, dtype=torch.float32).to(device=pred.device, dtype=real)


def check_target(name: str, pred: torch.Tensor, target: torch.Tensor, where: str) -> None:
    """``mse`` broadcasts with only a warning: a target of another shape is an error here."""
    if name == "mse" and tuple(target.shape) != tuple(pred.shape):
        raise SpecError(f"the target's shape {list(target.shape)} is not the prediction's {list(pred.shape)}",
                        where=where, expected=list(pred.shape), got=list(target.shape),
                        hint="mse compares element by element: give the target the output's shape — or, if the "
                             "target is right (an autoencoder's own input), the output's shape is what is off: "
                             "layerlab inspect shows which layer makes it")


def negative_loss(objective, losses: List[float]) -> Optional[Problem]:
    """cross_entropy and nll of valid inputs are ≥ 0; a loss below 0 falls without bound, and its
    fall says nothing about fitting (the outputs are not log-probabilities, or a float target is
    not a probability distribution)."""
    name = getattr(objective, "loss_name", None)
    target = getattr(objective, "target", None)
    if name == "cross_entropy" and target is not None and target.is_floating_point() and target.numel():
        dim = 1 if target.dim() >= 2 else 0
        sums = target.sum(dim)
        if bool((target < 0).any()) or not torch.allclose(sums, torch.ones_like(sums), atol=1e-3):
            return Problem("target-not-probabilities",
                           f"cross_entropy's float target is read as class probabilities, but it is not one "
                           f"(min {float(target.min()):.3g}, sums over dim {dim} from {float(sums.min()):.3g} to "
                           f"{float(sums.max()):.3g}): the loss has no floor, so its fall does not show fitting",
                           where="(loss)", severity="error",
                           hint="give class indices (target: {dtype: int64, high: C}) or probabilities that "
                                "are ≥ 0 and sum to 1 over the class dim")
    finite = [v for v in losses if math.isfinite(v)]
    if name not in ("cross_entropy", "nll") or not finite or min(finite) >= -1e-6:
        return None
    why = ("nll reads log-probabilities: end the model with log_softmax (or use cross_entropy on logits)"
           if name == "nll" else
           "a float target of cross_entropy is class probabilities (≥ 0, summing to 1 over the class dim); "
           "class indices are an int64 target (dtype: int64, high: C)")
    return Problem("loss-negative", f"{name} went below 0 (min {min(finite):.3g}): it can fall without bound, so "
                   "its fall does not show the model fitting", where="(loss)", severity="error", hint=why)

"""A spec's ``train:`` section, checked: every bad value is a :class:`SpecError` at its ``file:line:col``.

::

    train:
      loss: cross_entropy          # mse | cross_entropy | nll | model | an import path (--allow-import)
      target: {shape: [8], low: 0, high: 10}   # written like an input (default: random, seeded)
      output: 0                    # which output the loss reads (a position or a key such as logits)
      steps: 100
      optimizer: sgd               # adam | adamw | sgd
      lr: 0.05

Command-line options (``--steps``, ``--optimizer``, ``--lr``) win over the section.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from layerlab.errors import SpecError
from layerlab.spec.schema import did_you_mean
from layerlab.train.loss import LOSSES
from layerlab.train.optim import OPTIMIZERS

__all__ = ["TrainSection", "parse_section", "KEYS", "MAX_STEPS"]

KEYS = ("loss", "target", "output", "steps", "optimizer", "lr")
#: more steps than this is a training run, not a check
MAX_STEPS = 100_000


@dataclass
class TrainSection:
    """The section's values (``None``: not given). ``loss`` is a name or the imported callable;
    ``target`` is the parsed input (:class:`~layerlab.spec.schema.InputSpec`) or ``None``."""

    loss: Any = None
    target: Any = None
    output: Any = None
    steps: Optional[int] = None
    optimizer: Optional[str] = None
    lr: Optional[float] = None


def parse_section(data: Any, marks: Optional[Callable[..., str]], *, allow_import: bool = False,
                  base_dir: Optional[str] = None) -> TrainSection:
    """Check ``train:`` (``data`` as written; ``marks`` the spec's :class:`~layerlab.spec.load.Marks`)."""
    at = (lambda *p: marks("train", *p)) if marks is not None else (lambda *p: "train")
    if data is None:
        return TrainSection()
    if not isinstance(data, dict):
        raise SpecError("train: is a mapping of settings", where=at(), expected="{loss: mse, steps: 50, …}",
                        got=data)
    for key in data:
        if key not in KEYS:
            raise SpecError(f"train: has no key {key!r}", where=at(key), expected=", ".join(KEYS), got=key,
                            hint=did_you_mean(str(key), KEYS))
    out = TrainSection()
    if "loss" in data:
        out.loss = _loss(data["loss"], at("loss"), allow_import, base_dir)
    if "target" in data:
        from layerlab.spec.inputs import parse_input

        if marks is None:
            raise SpecError("train: target needs a spec file", where="train")
        out.target = parse_input("target", data["target"], marks, ("train", "target"), base_dir=base_dir)
    if "output" in data:
        value = data["output"]
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise SpecError("train: output picks one output by position or name", where=at("output"),
                            expected="0, 1, … or a key such as logits", got=value)
        out.output = value
    if "steps" in data:
        steps = data["steps"]
        if isinstance(steps, bool) or not isinstance(steps, int) or not 2 <= steps <= MAX_STEPS:
            raise SpecError("train: steps is a whole number of optimizer steps", where=at("steps"),
                            expected=f"2 … {MAX_STEPS}", got=steps)
        out.steps = steps
    if "optimizer" in data:
        name = data["optimizer"]
        if not isinstance(name, str) or name.strip().lower() not in OPTIMIZERS:
            raise SpecError(f"train: unknown optimizer {name!r}", where=at("optimizer"),
                            expected=" | ".join(OPTIMIZERS), got=name, hint=did_you_mean(str(name), OPTIMIZERS))
        out.optimizer = name.strip().lower()
    if "lr" in data:
        out.lr = check_lr(data["lr"], at("lr"), SpecError)
    return out


def check_lr(value: Any, where: str, error: type = SpecError) -> float:
    """A learning rate: a finite number > 0 (``1e-3`` written in YAML reads as a string: accepted)."""
    import math

    try:
        lr = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        lr = math.nan
    if not (math.isfinite(lr) and lr > 0):
        raise error("the learning rate must be a finite number > 0", where=where, expected="e.g. 0.001",
                    got=value)
    return lr


def _loss(value: Any, where: str, allow_import: bool, base_dir: Optional[str]) -> Any:
    if not isinstance(value, str) or not value.strip():
        raise SpecError("train: loss names a loss", where=where, expected=" | ".join(LOSSES) + " | module:function",
                        got=value)
    text = value.strip()
    if text.lower() in LOSSES:
        return text.lower()
    from layerlab.spec.resolve import is_import_path, is_trusted, resolve_callable

    if text.startswith("torch.") and ":" not in text:  # torch.nn.functional.huber_loss → module:attribute
        module, _, attribute = text.rpartition(".")
        text = f"{module}:{attribute}"
    if not (is_import_path(text) or (":" in text and is_trusted(text))):
        raise SpecError(f"train: unknown loss {text!r}", where=where,
                        expected=" | ".join(LOSSES) + " | an import path (module:function)", got=text,
                        hint=did_you_mean(text.lower(), LOSSES) or "torch.nn.functional:huber_loss needs no "
                        "--allow-import; your own ./losses.py:my_loss does")
    return resolve_callable(text, where=where, allow_import=allow_import, base_dir=base_dir).cls


def section_marks(target: Any) -> Dict[str, Any]:
    """``{"data", "marks", "base_dir"}`` of a Target's ``train:`` section (empty data when absent)."""
    return {"data": (getattr(target, "sections", None) or {}).get("train"),
            "marks": getattr(target, "marks", None), "base_dir": getattr(target, "base_dir", None)}

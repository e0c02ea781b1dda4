"""Result objects of ``layerlab train-check``: plain dataclasses, no formatting (see cli/render_train).

Per step ``i`` (0-based) the lists hold: ``losses[i]`` the loss before the ``i``-th update,
``grad_norms[i]`` the global gradient norm of that backward, and per parameter group (the
parameters one module registers itself) ``grad_norm[i]`` and ``update_ratio[i]`` =
‖Δw‖ / ‖w‖ of that update (``None`` where it has no value: no gradient, weights still all 0, or the
run stopped). Findings are :class:`~layerlab.errors.Problem`\\ s: ``severity`` ``error`` fails the
check (exit 1), ``warning`` is shown but does not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from layerlab.errors import Problem
from layerlab.report_render import Displayable

#: Bumped only when a key is removed or changes meaning (adding keys keeps the version).
SCHEMA_VERSION = 1
KIND = "train-check-report"


@dataclass
class GroupTrace:
    """The parameters one module registers itself (``recurse=False``), traced over the steps.

    Attributes:
        module: the module's qualified name (``""`` for the root); ``class_name`` its class.
        params: the full names of its parameters; ``numel`` their element count.
        grad_norm: ‖grad‖ per step (``None``: no parameter of the group got a gradient).
        update_ratio: ‖Δw‖ / ‖w before‖ per step (``None``: not updated, or ‖w‖ = 0).
        median_ratio: the median of ``update_ratio`` over the steps that have one.
        status: ``ok``, or the code of the finding about this group (``not-learning``,
            ``unstable``, ``no-grad``, ``wrong-output``, ``unread-output``, ``not-in-optimizer``,
            ``zero-grad``, ``requires-grad-false``, ``recreated-in-forward``, ``no-signal``).
        changed: whether any of its parameters differ after the run from before it.
    """

    module: str
    class_name: str
    params: List[str]
    numel: int
    grad_norm: List[Optional[float]] = field(default_factory=list)
    update_ratio: List[Optional[float]] = field(default_factory=list)
    median_ratio: Optional[float] = None
    status: str = "ok"
    changed: bool = False

    @property
    def label(self) -> str:
        return self.module or "(root)"


@dataclass
class FitVerdict:
    """Did the loss fall on one fixed batch, and by how much?

    Attributes:
        verdict: ``overfits`` (fell by ``expected`` or more), ``falls`` (fell, less than that),
            ``slow`` (fell by under 10 % but steadily), ``flat``, ``rises`` or ``nonfinite``.
        initial, final: the loss at the first step and the best of the last few steps.
        factor: initial / final (how many times smaller it got).
        expected: the factor that counts as "overfits one batch".
        trainable: trainable parameter elements; ``target_values``: elements of the target.
        message: the verdict in one sentence, with the reason where the model can't fit exactly.
    """

    verdict: str
    initial: float
    final: float
    factor: float
    expected: float
    trainable: int
    target_values: Optional[int]
    message: str


@dataclass
class NonFinite:
    """The first step where the loss, a gradient or (after the update) a weight was NaN/Inf.

    Attributes:
        step: the step (0-based); ``what``: ``loss``, ``gradient`` or ``weights``.
        where: the module it came from (qualified name; ``(root)``; ``(loss)`` for the loss itself).
        message: what layerlab saw there (from ``layerlab.inspect`` of that step, when it ran).
        params: the parameters whose gradient (or value) was not finite.
        hint: what to change, when the cause is known (else the finding's generic hint).
    """

    step: int
    what: str
    where: str
    message: str
    params: List[str] = field(default_factory=list)
    hint: Optional[str] = None


@dataclass(repr=False)  # repr, str, Rich and HTML: layerlab.report_render.Displayable
class TrainReport(Displayable):
    """Everything ``layerlab.train_check`` saw over the steps."""

    target: str
    model: str
    device: str
    dtype: str
    mode: str
    seed: int
    inputs: Dict[str, Any]
    loss: str
    output: str
    target_source: str
    optimizer: str
    lr: Optional[float]
    steps: int
    steps_run: int
    losses: List[float]
    grad_norms: List[Optional[float]]
    fit: FitVerdict
    groups: List[GroupTrace]
    nonfinite: Optional[NonFinite] = None
    flags: List[Problem] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """No finding of severity ``error``."""
        return not self.errors

    @property
    def errors(self) -> List[Problem]:
        return [f for f in self.flags if f.severity == "error"]

    @property
    def warnings(self) -> List[Problem]:
        return [f for f in self.flags if f.severity != "error"]

    def flag(self, code: str) -> List[Problem]:
        """The findings with this code (``unstable``, ``no-grad``, …)."""
        return [f for f in self.flags if f.code == code]

    def group(self, module: str) -> GroupTrace:
        for g in self.groups:
            if g.module == module:
                return g
        raise KeyError(f"no parameter group {module!r}")

    def to_dict(self) -> dict:
        from layerlab.serialize import to_jsonable

        return {
            "schema": SCHEMA_VERSION,
            "kind": KIND,
            "ok": self.ok,
            "target": self.target,
            "model": self.model,
            "device": self.device,
            "dtype": self.dtype,
            "mode": self.mode,
            "seed": self.seed,
            "inputs": to_jsonable(self.inputs),
            "loss": self.loss,
            "output": self.output,
            "target_source": self.target_source,
            "optimizer": self.optimizer,
            "lr": self.lr,
            "steps": self.steps,
            "steps_run": self.steps_run,
            "losses": to_jsonable(self.losses),
            "grad_norms": to_jsonable(self.grad_norms),
            "fit": to_jsonable(self.fit),
            "groups": [dict(to_jsonable(g), label=g.label) for g in self.groups],
            "nonfinite": to_jsonable(self.nonfinite),
            "flags": [to_jsonable(f) for f in self.flags],
            "notes": list(self.notes),
            "seconds": round(self.seconds, 3),
        }

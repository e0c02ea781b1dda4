"""``layerlab.train_check``: N optimizer steps on one fixed batch, and what they show.

    >>> import torch, layerlab
    >>> _ = torch.manual_seed(0)
    >>> model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    >>> report = layerlab.train_check(model, torch.randn(4, 8))
    >>> report.ok, report.fit.verdict
    (True, 'overfits')

The classic sanity checks before a long training run, on a *copy* of the model (the user's module,
its weights and its optimizer are never touched): can it overfit one batch (:mod:`~.fit`), does
every parameter get a gradient and change (:mod:`~.frozen`), is each update a sane fraction of the
weights (:mod:`~.updates`), and where does a NaN/Inf first appear (:mod:`~.diverge`).

Defaults: Adam, lr 1e-2 (SGD: 0.1), 50 steps. A single-batch check wants each step to move the
weights by about a percent — Adam's step is ≈ lr per element, ≈ 1e-2 / 0.1 for a default-initialised
layer — so that a model that can fit the batch does so within 50 steps; torch's 1e-3 moves them 10×
slower and leaves most models short of it. The loss, target and output the loss reads are described
in :mod:`~.loss`; a spec's ``train:`` section in :mod:`~.section`. The global RNG is seeded for the
run (dropout masks) and restored afterwards.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional

import torch

from layerlab.errors import CheckFailed, LayerlabError, Problem, UsageError
from layerlab.target.entry import entry_point
from layerlab.target.bind import map_args
from layerlab.target.copying import copy_model
from layerlab import faults
from layerlab.faults import watch_model
from layerlab.target.fresh_inputs import FreshInputs
from layerlab.spec.limits import clean_text
from layerlab.train import (ce_floor, constant_output, diverge, forward_blame, frozen, high_dropout, loss as L,
                            optimizer_step, output_range, recreated, replay, squashed, summed, unregistered)
from layerlab.train.assemble import build_report
from layerlab.train.objective import build_objective, loss_value
from layerlab.train.optim import build_optimizer
from layerlab.train.report import TrainReport
from layerlab.train.section import MAX_STEPS, check_lr, parse_section
from layerlab.train.updates import Tracker

__all__ = ["train_check", "train_target", "DEFAULT_STEPS"]

DEFAULT_STEPS = 50


@entry_point("train-check")
def train_check(module_or_spec: Any, *inputs: Any, loss: Any = None, target: Any = None, output: Any = None,
                steps: Optional[int] = None, optimizer: Any = None, lr: Optional[float] = None, seed: int = 0,
                mode: Optional[str] = None, allow_import: bool = False,
                forward_kwargs: Optional[Dict[str, Any]] = None, threads: Optional[int] = None,
                **kwargs: Any) -> TrainReport:
    """Train a copy of the model for ``steps`` optimizer steps on one fixed batch; report what happened.

    Args:
        module_or_spec (nn.Module or str): the model (with ``*inputs``/``**kwargs`` as forward takes
            them) or a YAML spec path (its ``train:`` section supplies the defaults below).
        loss (str or callable, optional): ``"mse"``, ``"cross_entropy"``, ``"nll"``, ``"model"`` (the
            output is the loss) or ``loss(prediction, target) -> scalar``. Default: the model's own
            ``loss`` output if it returns one, else ``"mse"``.
        target (Tensor, optional): what the prediction should become. Default: seeded random.
        output (int or str, optional): which output the loss reads. Default: see :mod:`layerlab.train.loss`.
        steps (int, optional): optimizer steps (≥ 2). Default: 50.
        optimizer (optional): ``"adam"``, ``"adamw"``, ``"sgd"``, an Optimizer class, a factory
            ``f(model) -> Optimizer`` or an Optimizer built on ``module`` (see :mod:`layerlab.train.optim`).
        lr (float, optional): learning rate of a named optimizer. Default: 1e-2 (Adam), 0.1 (SGD).
        seed (int, optional): seed of the default target and of dropout. Default: 0.
        mode (str, optional): ``"train"`` or ``"eval"``; ``None`` keeps the module's flags.
        allow_import (bool, optional): a spec may import user code (its layers, its loss).
        forward_kwargs (dict, optional): forward keyword arguments whose names clash with these.
        threads (int, optional): torch intra-op threads during the run (restored after). Default: torch's.

    Returns:
        TrainReport: ``ok`` is False when a check failed (``report.errors``).
    """
    from layerlab.arguments import check_seed

    check_seed(seed, "seed")
    if isinstance(module_or_spec, (str, bytes)) or hasattr(module_or_spec, "__fspath__"):
        if inputs or kwargs:
            raise UsageError("a spec brings its own inputs: pass no inputs with a spec path", where="inputs")
        from layerlab.spec import Overrides
        from layerlab.target.build import resolve

        built = resolve(str(module_or_spec), overrides=Overrides(seed=seed), allow_import=allow_import,
                        reference=False)
        original = None
    else:
        from layerlab.target.core import from_module

        if not isinstance(module_or_spec, torch.nn.Module):
            raise UsageError("train_check takes an nn.Module (and its inputs) or a spec path", where="module",
                             got=type(module_or_spec).__name__)
        built = from_module(copy_model(module_or_spec), *inputs, seed=seed, forward_kwargs=forward_kwargs,
                            **kwargs)
        original = module_or_spec
    return train_target(built, loss=loss, target=target, output=output, steps=steps, optimizer=optimizer, lr=lr,
                        mode=mode, allow_import=allow_import, original=original, copied=original is not None,
                        threads=threads)


def train_target(built: Any, *, loss: Any = None, target: Any = None, output: Any = None,
                 steps: Optional[int] = None, optimizer: Any = None, lr: Optional[float] = None,
                 mode: Optional[str] = None, allow_import: bool = False, original: Any = None, copied: bool = False,
                 progress: Optional[Callable[[str, int, int], None]] = None,
                 threads: Optional[int] = None) -> TrainReport:
    """The check on a built :class:`~layerlab.target.Target` (what the CLI calls); explicit arguments win
    over the spec's ``train:`` section. ``copied``: ``built.module`` is already a private copy.
    ``threads``: torch intra-op threads for the run (restored after) — on a machine whose cores other
    jobs hold, 1 thread avoids waiting on a descheduled one (a 2-layer LSTM: 0.1 s alone, 12–23 s with
    2 threads beside other jobs on 2 cores); the verdicts do not depend on it."""
    from layerlab.arguments import check_threads

    check_threads(threads, "--threads")
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _train_target(built, loss=loss, target=target, output=output, steps=steps, optimizer=optimizer,
                             lr=lr, mode=mode, allow_import=allow_import, original=original, copied=copied,
                             progress=progress)
    finally:
        torch.set_num_threads(previous)


def _train_target(built: Any, *, loss: Any, target: Any, output: Any, steps: Optional[int], optimizer: Any,
                  lr: Optional[float], mode: Optional[str], allow_import: bool, original: Any, copied: bool,
                  progress: Optional[Callable[[str, int, int], None]]) -> TrainReport:
    section = parse_section((built.sections or {}).get("train"), built.marks, allow_import=allow_import,
                            base_dir=built.base_dir)
    marks = built.marks
    at = (lambda key: marks("train", key)) if marks is not None and "train" in (built.sections or {}) else \
        (lambda key: key)
    steps = steps if steps is not None else section.steps if section.steps is not None else DEFAULT_STEPS
    if isinstance(steps, bool) or not isinstance(steps, int) or not 2 <= steps <= MAX_STEPS:
        raise UsageError("steps is a whole number of optimizer steps", where="--steps", expected=f"2 … {MAX_STEPS}",
                         got=steps)
    if lr is not None:
        lr = check_lr(lr, "--lr", UsageError)
    model = built.module if copied else copy_model(built.module)
    watch_model(model)  # a timeout names the copy's submodule by its path
    if mode is not None:
        model.train(mode == "train")
    args = map_args(built.args, lambda t: t.detach())  # the batch is data: no gradient w.r.t. it
    positional = [a.value for a in args if not a.keyword]
    keyword = {a.name: a.value for a in args if a.keyword}
    fresh = FreshInputs((a.name, a.value) for a in args)  # a forward that writes into its input: each step
    _materialise(model, positional, keyword)
    chosen_opt, chosen_lr = optimizer if optimizer is not None else section.optimizer or "adam", \
        lr if lr is not None else section.lr
    opt, opt_text, rate = build_optimizer(chosen_opt, chosen_lr, model, original)
    # the weights before the first step, for a replay that tests a finding's cause (see replay.py)
    initial = replay.snapshot(model) if summed.scales_with_loss(opt) or high_dropout.high(model) else None
    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(built.seed)
        run = _Run(model, positional, keyword, opt, steps, built.seed, progress)
        run.fresh = fresh
        objective = run.go(lambda out: build_objective(out, section, loss, target, output, built, args, at))
    chosen = optimizer if optimizer is not None else section.optimizer
    # the lr is this check's choice (not the user's): a named optimizer or a class, with no lr given
    default_lr = lr is None and section.lr is None and (chosen is None or isinstance(chosen, (str, type)))
    again = _replayer(model, initial, positional, keyword, objective, steps, built.seed,
                      lambda twin: build_optimizer(chosen_opt, chosen_lr, twin, original)[0], fresh)
    report = build_report(built, model, run, objective, opt_text, rate, steps, args, opt, default_lr, again)
    report.notes.extend(fresh.note())
    report.seconds = time.perf_counter() - t0
    return report


def _replayer(model, initial, positional, keyword, objective, steps, seed, make_optimizer, fresh=None):
    """``again(scale=None, change=None, floor=None)``: the run replayed from ``initial`` with the loss scaled by
    ``scale(value)`` or the model changed by ``change(copy)``, judged above ``floor`` (``None`` without a snapshot)."""
    if initial is None or objective is None:
        return None
    values = objective.target.numel() if objective.target is not None else None

    def again(scale=None, change=None, floor=None):
        if fresh is not None:
            fresh.refresh()
        loss = objective if scale is None else (lambda out: scale(objective(out)))
        return replay.replay(model, initial, positional, keyword, loss, make_optimizer, steps, seed, values, change,
                             floor)
    return again


def _materialise(model: torch.nn.Module, positional: list, keyword: Dict[str, Any]) -> None:
    """Lazy modules (``nn.LazyLinear``) get their parameters on the first forward: run one, without
    gradients, before the optimizer and the trackers look at the parameters."""
    from torch.nn.parameter import UninitializedParameter

    if any(isinstance(p, UninitializedParameter) for p in model.parameters()):
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            model(*positional, **keyword)


class _Run:
    """The loop: forward, loss, backward, step — recording as it goes, stopping at the first NaN/Inf."""

    def __init__(self, model, positional, keyword, opt, steps, seed, progress) -> None:
        self.model, self.positional, self.keyword, self.opt = model, positional, keyword, opt
        self.steps, self.seed, self.progress = steps, seed, progress
        self.losses: List[float] = []
        self.tracker = Tracker(model)
        self.watch = frozen.Watch(model)
        self.loss_reach: set = set()
        self.output_reach: Dict[str, set] = {}
        self.nonfinite = None
        self.summed = None  # the first step's loss is a sum over many elements (summed.py)
        self.early: List[Problem] = []  # seen in the first step's graph: unregistered tensors, a double softmax
        self.identity = recreated.identities(model)  # parameter objects: a forward may replace one
        self.floor = None  # why the default random target is out of the prediction's reach (output_range.py)
        self.same: List[bool] = []  # the prediction equal for every sample, at the first and the last step
        self.first_pred = None  # the first step's prediction, detached
        self.shape = None  # the prediction's shape (a cross-entropy's class count, for its floor: floor.py)
        self.loop = optimizer_step.LoopWatch(opt, self.tracker.ids)  # zero_grad that clears nothing, a shrunk step

    def go(self, make_objective: Callable[[Any], L.Objective]) -> L.Objective:
        objective = None
        try:
            for step in range(self.steps):
                if self.progress is not None:
                    self.progress("train", step, self.steps)
                faults.step(f"step {step}")
                self.opt.zero_grad(set_to_none=True)
                self.loop.zeroed(step)
                out = self._forward(step)
                if objective is None:
                    objective = make_objective(out)
                value = loss_value(objective, out)
                if step == 0:
                    self.loss_reach = frozen.reachable([value])
                    self.output_reach = frozen.output_reach(out, skip=objective.output_path)
                    self.early = unregistered.findings(self.model, unregistered.leaves([value]),
                                                    inputs=(self.positional, self.keyword))
                    self.summed = summed.detect(value)
                    wrong_input = squashed.findings(objective, L.select(out, objective.output_path),
                                                    self.watch.made_by, value)
                    self.early += [wrong_input] if wrong_input is not None else []
                    pred, first = L.select(out, objective.output_path), float(value.detach())
                    self.shape = tuple(pred.shape)
                    self.first_pred = pred.detach()  # copy_target.py: which target position each position is compared with
                    ce_floor.adopt(objective, value, self.shape)  # your function's label smoothing: its floor
                    self.early += recreated.findings(self.model, self.identity) + output_range.findings(
                        objective, pred, first, self.watch.made_by)
                    self.floor = output_range.default_target_floor(objective, pred, first, self.watch.made_by)
                    self.watch.made_by = []  # autograd nodes: a later deepcopy of the hooked model can't copy them
                    self.watch.first = False
                self.losses.append(float(value.detach()))
                if step in (0, self.steps - 1) and objective.fn is not None:
                    self.same.append(constant_output.rows_equal(L.select(out, objective.output_path)))
                if not torch.isfinite(value.detach()):
                    self.nonfinite = self._locate(objective, step, "loss", [])
                    break
                self._backward(value, step)
                finite, bad = self.tracker.after_backward()
                if not finite:
                    self.nonfinite = self._locate(objective, step, "gradient", bad)
                    break
                self.tracker.before_update()
                self.loop.stepping(step)
                self.opt.step()
                self.loop.stepped(step)
                blown = self.tracker.after_update()
                if blown:
                    rate = self.opt.param_groups[0].get("lr")
                    named = dict(zip(self.tracker.names, self.tracker.params))
                    self.nonfinite = diverge.weights_blew_up(step, blown, rate if isinstance(rate, float) else None,
                                                             self.opt.param_groups[0].get("eps"),
                                                             [named[n].detach() for n in blown if n in named])
                    break
        finally:
            self.watch.remove()
        if self.progress is not None:
            self.progress("", self.steps, self.steps)
        self.tracker.finish()
        return objective

    def _forward(self, step: int) -> Any:
        fresh = getattr(self, "fresh", None)
        if fresh is not None:
            fresh.refresh()  # the values the user passed, if the last step wrote into them
        try:
            return self.model(*self.positional, **self.keyword)
        except LayerlabError:
            raise
        except Exception as exc:
            self.watch.remove()  # the run is over; its hooks (and autograd nodes) stay off inspect's copy
            raise forward_blame.forward_failed(self.model, self.positional, self.keyword, step, exc,
                                               self.seed + step) from None

    def _backward(self, value: torch.Tensor, step: int) -> None:
        try:
            value.backward()
        except RuntimeError as exc:  # an in-place op on a tensor backward needs, a graph freed twice, …
            first = str(exc).split(". Hint:")[0].splitlines()[0]
            where, hint = f"step {step}", "layerlab inspect on the same spec runs the backward module by module"
            if "inplace operation" in first:
                inplace = [p or "(root)" for p, m in self.model.named_modules() if getattr(m, "inplace", False) is True]
                where = inplace[0] if len(inplace) == 1 else where
                hint = ("make the in-place op out-of-place (x = x * 2, not x.mul_(2); nn.ReLU(inplace=False))" +
                        (f"; modules with inplace=True here: {', '.join(inplace[:5])}" if inplace else ""))
            elif "does not require grad" in first:
                hint = ("the loss has no autograd graph: it was computed from a detached prediction (.detach(), "
                        ".data, torch.no_grad, numpy), or no parameter requires grad")
            raise CheckFailed(f"backward failed at step {step}: {clean_text(first, 400)}", where=where,
                              hint=hint) from None

    def _locate(self, objective, step, what, bad):
        # the weights are those the failing step ran with (the loop stopped before updating)
        return diverge.locate(self.model, self.positional, self.keyword, objective, step, what, bad, self.seed + step)

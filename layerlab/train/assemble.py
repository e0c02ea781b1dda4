"""The train-check report from a finished run: the verdict on the loss, then every finding, in order.

:func:`build_report` judges the loss curve against the loss's exact floor (:mod:`~.floor`), asks
each finding module what the run shows (dropout, constant output, frozen or unregistered
parameters, update ratios, NaN/Inf …), drops what another finding already says with its cause, and
withdraws "more steps will get there" where a finding says parameters cannot learn.
"""

from __future__ import annotations

from typing import List

from layerlab.errors import Problem
from layerlab.target.bind import describe
from layerlab.train import (constant_output, copy_target, fit, floor, frozen, high_dropout, loss as L, no_signal,
                            optimizer_step, replay, summed, target_scale, vanishing, zero_path)
from layerlab.train.optim import decay_finding, optimizer_names
from layerlab.train.report import TrainReport
from layerlab.train.updates import ratio_findings

__all__ = ["build_report"]


def build_report(built, model, run, objective, opt_text, rate, steps, args, opt, default_lr: bool,
                 again) -> TrainReport:
    tracker = run.tracker
    trainable = sum(p.numel() for p in tracker.params if p.requires_grad)
    target_values = None if objective is None or objective.target is None else objective.target.numel()
    positional, keyword = [a.value for a in args if not a.keyword], {a.name: a.value for a in args if a.keyword}
    equal_inputs = objective is not None and objective.target is not None and len(run.same) >= 2 and \
        all(run.same) and objective.target.dim() > 0 and \
        constant_output.same_inputs([*positional, *keyword.values()], objective.target.shape[0])
    # the loss's exact minimum given its target (soft targets; a constant prediction): judged above it
    lowest = (floor.constant_floor(objective, run.shape) if equal_inputs else None) or \
        (floor.exact_floor(objective, run.shape) if objective is not None else None)
    again = replay.with_floor(again, lowest)  # a replay is judged above the same floor as this run
    verdict = fit.judge(run.losses, steps, trainable, target_values, stopped=run.nonfinite is not None,
                        floor=lowest)
    if run.floor is not None and verdict.verdict in ("falls", "slow"):  # "more steps will get there" is wrong
        verdict.message = f"{verdict.message.split('; ')[0]}; {run.floor}"
    dropout = high_dropout.findings(model, verdict, again)  # p > 0.5: replayed with dropout off
    if verdict.verdict in ("falls", "slow") and frozen.active_dropout(model) and "dropout" not in verdict.message:
        verdict.message += "; dropout is active (train mode), which keeps the loss of one batch noisy and above 0"
    flags: List[Problem] = [dropout] if dropout is not None else []
    empty = no_signal.zero_loss(run.losses, tracker.nonzero_grad, verdict, objective,
                                 run.first_pred)  # a mask that zeroes every element
    flags += [empty] if empty is not None else []
    same = constant_output.finding(run.same, objective, verdict.verdict, equal_inputs) if empty is None else None
    flags += [same] if same is not None else []
    if same is not None and same.severity == "warning" and verdict.verdict in ("falls", "slow"):
        # equal inputs: one prediction for every sample is as far as it can go; "run more steps" would contradict it
        verdict.message = (f"{verdict.message.split('; ')[0]}; every sample has the same input, so one prediction "
                           "serves them all: whatever the steps, the loss cannot go below that of the best single "
                           "prediction (see constant-output)")
    if run.nonfinite is not None:
        nf = run.nonfinite
        cause, hint = no_signal.nan_at_start(model, positional, keyword, objective) if nf.step == 0 and \
            nf.what == "loss" else (None, nf.hint or "lower the learning rate, or look at this module's inputs and "
                                    "arithmetic")
        flags.append(Problem("nonfinite", f"step {nf.step}: the {nf.what} {'are' if nf.what == 'weights' else 'is'} "
                             f"not finite — {nf.message}" + (f"; {cause}" if cause else ""), where=nf.where,
                             severity="error", data={"step": nf.step, "params": nf.params}, hint=hint))
    elif verdict.verdict == "slow" and not (same is not None and same.severity == "warning"):
        lr_text = f"this check's default lr {rate:g} may be small for this model: " if default_lr and rate else ""
        flags.append(Problem("loss-slow", verdict.message, where="(loss)", severity="warning",
                             hint=f"{lr_text}run more steps (--steps {steps * 4}) or raise --lr to see whether it "
                                  "gets 10× lower; the update/weight ratios below say how far each step moves the "
                                  "weights"))
    elif verdict.verdict in ("flat", "rises") and empty is None:
        # a model with fewer trainable values than the random target has may have nowhere to go
        small = target_values is not None and trainable < target_values and verdict.verdict == "flat"
        flags.append(Problem(f"loss-{verdict.verdict}", verdict.message + (
            f" — but with {trainable:,} trainable values for {target_values:,} random target values it may "
            "have little room to fall" if small else ""), where="(loss)", severity="warning" if small else "error",
            hint="see the findings below; check the loss reads the right output and the lr"))
    flags += target_scale.findings(model, positional, keyword, objective, verdict, run.nonfinite, flags)  # 2e5 vs 0.1
    no_backward = run.nonfinite is not None and run.nonfinite.step == 0 and run.nonfinite.what == "loss"
    found = [] if no_backward else frozen.parameter_findings(  # no backward ran: no evidence either way
        model, tracker.names, tracker.params, in_optimizer=optimizer_names(opt), had_grad=tracker.had_grad,
        nonzero_grad=tracker.nonzero_grad, loss_reach=run.loss_reach, output_reach=run.output_reach,
        loss_output=objective.output_path if objective else "?", watch=run.watch,
        output_named=objective.output_named if objective else True)
    flags.extend(run.watch.dead_relu_problem(path) for path in run.watch.dead_relus())
    if run.watch.dead_relus():  # a dead ReLU makes every later output the same: said once, with its cause
        flags = [f for f in flags if f.code != "constant-output"]
    swapped = {p for f in run.early if f.code == "recreated-in-forward" for p in f.data["params"]}
    found = [f for f in found if not (swapped and set(f.data.get("params", [])) <= swapped)
             and not (empty is not None and f.code == "zero-grad")]  # said once, by the finding with the cause
    constructed = frozen.by_construction(found)  # zero by construction: a note, not a flag
    found = [f for f in found if f.severity != "info"]
    flags.extend(found)
    no_signal.all_padding(model, positional, keyword, flags, verdict.verdict, run.same)
    flags.extend(run.early + [f for f in [copy_target.finding(objective, args, run.first_pred)] if f is not None])
    decay = decay_finding(opt, steps, verdict.verdict, model)
    flags.extend(([decay] if decay is not None else []) + run.loop.findings(verdict.verdict))
    tracker.mark(found + [f for f in run.early if f.code == "recreated-in-forward"])
    for g in tracker.groups if empty is not None else []:
        g.status = "no-signal" if g.status == "ok" else g.status
    flags.extend(f for f in ratio_findings(tracker.groups, verdict.verdict, run.nonfinite is not None,
                                           default_lr=rate if default_lr else None)
                 if empty is None or f.code != "not-learning")  # no gradient at all: not a step-size matter
    vanishing.amend(flags, tracker.groups, model)
    zero_path.amend(flags, model, positional, keyword, objective)  # the op that passes no gradient
    target_scale.demote(flags)  # a raw-unit target beside a dead layer: not the cause
    optimizer_step.point_hints(flags)
    idle = frozen.mode_findings(model)
    if idle is not None:
        flags.append(idle)
    negative = L.negative_loss(objective, run.losses)
    if negative is not None:
        flags.append(negative)
    failed = run.nonfinite is not None or verdict.verdict in ("rises", "flat") or any(
        f.code == "unstable" for f in flags)
    summed_loss = summed.findings(run.summed, opt, rate, failed, flags, again)  # replayed with the loss / N
    flags[:0] = [summed_loss] if summed_loss is not None else []
    stuck = [f"{f.code} {f.where}" for f in flags if f.severity == "error" and f.code in _STUCK]
    if verdict.verdict in ("falls", "slow") and stuck:
        # the "more steps or a larger lr" advice is wrong when parameters cannot learn at all
        verdict.message = verdict.message.split("; short of")[0].split(": more steps")[0].split("; too slowly")[0] + (
            f"; short of {fit.EXPECTED:g}×, and more steps will not help: {', '.join(stuck)} (see below)")
        for f in flags:
            if f.code == "loss-slow":  # its "more steps or a larger lr" hint is the advice just withdrawn
                f.message, f.hint = verdict.message, "fix the errors below first"
    notes = [verdict.message] + constructed
    if objective is not None and objective.fn is not None:
        notes.append(f"the loss reads {objective.output_path}; target: {objective.target_source}, "
                     f"shape {list(objective.target.shape)}")
    first = next(iter(model.parameters()), None)
    return TrainReport(
        target=built.name, model=type(model).__name__, device=str(first.device) if first is not None else "cpu",
        dtype=str(first.dtype).replace("torch.", "") if first is not None else "float32",
        mode="train" if model.training else "eval", seed=built.seed,
        inputs={a.name: describe(a.value) for a in args}, loss=objective.loss_name if objective else "?",
        output=objective.output_path if objective else "?",
        target_source=objective.target_source if objective else "?", optimizer=opt_text, lr=rate, steps=steps,
        steps_run=len(run.losses), losses=run.losses, grad_norms=tracker.total_grad_norms, fit=verdict,
        groups=tracker.groups, nonfinite=run.nonfinite, flags=flags, notes=notes)


#: findings that mean parameters cannot learn, whatever the number of steps
_STUCK = ("dead-relu", "zero-grad", "no-grad", "not-in-optimizer", "wrong-output", "unregistered", "double-softmax",
          "output-range", "target-broadcast", "recreated-in-forward", "no-signal",
          "double-sigmoid", "weight-decay", "step-shrunk")

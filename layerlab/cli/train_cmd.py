"""``layerlab train-check NAME|SPEC``: N optimizer steps on one fixed batch — does the loss fall?

Parse → :func:`layerlab.train.run.train_target` → :mod:`layerlab.cli.render_train`. Exit codes: 0 every
check passed (warnings may be shown), 1 a check failed or the model raised, 2 bad usage or a bad spec
(its ``train:`` section included).
"""

from __future__ import annotations

from typing import Optional

import typer
from typing import Annotated

from layerlab.cli.options import (DeviceOpt, DtypeOpt, InputShapeOpt, JsonOpt, ModeOpt, SeedOpt, ThreadsOpt,
                                  overrides)
from layerlab.cli.target_arg import AllowImportOpt, device_of, refuse_meta, resolve

TargetArg = Annotated[str, typer.Argument(
    metavar="NAME|SPEC", help="A layerlab registry name (linear) or a YAML spec (its train: section is read).",
    show_default=False)]
StepsOpt = Annotated[Optional[int], typer.Option(
    "--steps", min=2, max=100_000, help="Optimizer steps on the one batch (the spec's train: steps, else 50).",
    show_default=False)]
OptimizerOpt = Annotated[Optional[str], typer.Option(
    "--optimizer", metavar="adam|adamw|sgd", help="The optimizer (the spec's, else adam).", show_default=False)]
LrOpt = Annotated[Optional[float], typer.Option(
    "--lr", help="Learning rate (the spec's, else 1e-2 for adam, 0.1 for sgd).", show_default=False)]


def command(
    target: TargetArg,
    steps: StepsOpt = None,
    optimizer: OptimizerOpt = None,
    lr: LrOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    mode: ModeOpt = None,
    input_shape: InputShapeOpt = None,
    seed: SeedOpt = None,
    allow_import: AllowImportOpt = False,
    threads: ThreadsOpt = None,
    json: JsonOpt = False,
) -> int:
    """Train a copy for a few steps on one fixed batch: can it overfit, does every parameter learn?

    Reports the loss curve, whether it fell by the expected factor, per-layer gradient norms and
    update/weight ratios, parameters that never changed (and why), and the first step where the
    loss or a gradient became NaN/Inf, with the module it came from.

    The loss, its target and the output it reads come from the spec's [b]train:[/] section
    (loss: mse | cross_entropy | nll | model | module:function); by default MSE against a seeded
    random target of the output's shape.

    [b]Examples[/b]

      layerlab train-check configs/factory_mlp.yaml --allow-import
      layerlab train-check configs/train_classifier.yaml --steps 100 --lr 0.05 --optimizer sgd
      layerlab train-check linear --json
    """
    from layerlab.cli.output import Output
    from layerlab.errors import CheckFailed, UsageError
    from layerlab.train.optim import OPTIMIZERS

    out = Output(json_mode=json)
    if optimizer is not None and optimizer.strip().lower() not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer {optimizer!r}", where="--optimizer", expected=" | ".join(OPTIMIZERS),
                         got=optimizer)
    if lr is not None:
        from layerlab.train.section import check_lr

        check_lr(lr, "--lr", UsageError)
    device_of(device)
    options = overrides(device=device, dtype=dtype, seed=seed, mode=mode, input_shape=input_shape)
    resolved = resolve(target, options=options, allow_import=allow_import, reference=False)
    refuse_meta(resolved)
    from layerlab.cli.progress import steps as progress_steps
    from layerlab.train.run import train_target

    with progress_steps(out.err, "train-check", json_mode=out.json_mode) as advance:
        report = train_target(resolved, steps=steps, optimizer=optimizer, lr=lr, allow_import=allow_import,
                              copied=True, progress=advance, threads=threads)
    if out.json_mode:
        out.json(report)
    else:
        from layerlab.cli.render_train import report as render

        out.show(*render(report))
    if not report.ok:
        first = report.errors[0]
        raise CheckFailed(f"train-check failed: {first.message}", where=first.where, hint=first.hint)
    return 0

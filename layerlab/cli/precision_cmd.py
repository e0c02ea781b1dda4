"""``layerlab precision-check NAME|SPEC``: forward + backward in half precision against float32, module by module.

Parse → :mod:`layerlab.mixed` → :mod:`layerlab.cli.render_precision`. Exit codes: 0 no
module lost precision in any half-precision run (warnings and float16 forecasts allowed), 1 one
did (or the model raised), 2 bad usage or a bad spec.
"""

from __future__ import annotations

from typing import List, Optional

import typer
from typing import Annotated

from layerlab.cli.options import DeviceOpt, InputShapeOpt, JsonOpt, ModeOpt, SeedOpt, overrides
from layerlab.cli.target_arg import AllowImportOpt, device_of, refuse_meta, resolve

TargetArg = Annotated[str, typer.Argument(
    metavar="NAME|SPEC", help="A layerlab registry name (transformer_encoder_layer) or a YAML spec.",
    show_default=False)]
AutocastOpt = Annotated[Optional[List[str]], typer.Option(
    "--autocast", metavar="DTYPE", show_default=False,
    help="torch.autocast dtype(s) to run: bfloat16, float16 (repeatable or comma-separated; 'none' for none). "
         "Default: the spec's precision.autocast, else bfloat16 on CPU, float16 and bfloat16 on CUDA.")]
CastOpt = Annotated[Optional[List[str]], typer.Option(
    "--cast", metavar="DTYPE", show_default=False,
    help="Also run the whole model cast to DTYPE (float16, bfloat16), as --dtype does for the other "
         "commands, and compare it with float32 too.")]
GradScalerOpt = Annotated[Optional[bool], typer.Option(
    "--grad-scaler/--no-grad-scaler", show_default=False,
    help="float16 runs scale the loss by 2¹⁶ and unscale the gradients, as torch.amp.GradScaler does.")]
ToleranceScaleOpt = Annotated[Optional[float], typer.Option(
    "--tolerance-scale", metavar="K", show_default=False,
    help="Multiply every error bar (they are multiples of the dtype's eps) by K > 0.")]
DepthOpt = Annotated[Optional[int], typer.Option(
    "--depth", min=0, help="Show modules nested at most N deep (root = 0); flagged ones always show.",
    show_default=False)]
AllRowsOpt = Annotated[bool, typer.Option("--all-rows", help="Show every module call (default: the first 40).")]


def command(
    target: TargetArg,
    autocast: AutocastOpt = None,
    cast: CastOpt = None,
    grad_scaler: GradScalerOpt = None,
    tolerance_scale: ToleranceScaleOpt = None,
    device: DeviceOpt = None,
    mode: ModeOpt = None,
    input_shape: InputShapeOpt = None,
    seed: SeedOpt = None,
    depth: DepthOpt = None,
    all_rows: AllRowsOpt = False,
    allow_import: AllowImportOpt = False,
    json: JsonOpt = False,
) -> int:
    """Run forward + backward in half precision and in float32; name the first module that loses precision.

    Per module call: output and gradient error against float32 (in units of the dtype's eps),
    the dtype it ran in and its own ops, values beyond float16's range, gradients that underflow.
    The first module that loses precision is named with the op that did it and a fix.

    [b]Examples[/b]

      layerlab precision-check configs/transformer_preln.yaml
      layerlab precision-check configs/precision_variance.yaml --allow-import --autocast float16
      layerlab precision-check model.yaml --cast float16 --json
    """
    from layerlab.cli.output import Output

    out = Output(json_mode=json)
    if tolerance_scale is not None:
        _check_scale(tolerance_scale)
    device_of(device)  # an absent device is --device's fault, not the spec's
    options = overrides(device=device, seed=seed, mode=mode, input_shape=input_shape)
    resolved = resolve(target, options=options, allow_import=allow_import, reference=False)
    refuse_meta(resolved)
    from layerlab.cli.progress import steps
    from layerlab.mixed import check_target

    with steps(out.err, "precision-check", json_mode=out.json_mode) as advance:
        report = check_target(resolved, autocast=_dtypes(autocast, "--autocast"), cast=_dtypes(cast, "--cast"),
                              grad_scaler=grad_scaler, tolerance_scale=tolerance_scale, progress=advance)
    if out.json_mode:
        out.json(report)
    else:
        from layerlab.cli.render_precision import report as render

        out.show(*render(report, depth=depth, limit=None if all_rows else 40))
    for skipped in report.skipped:
        out.warn(f"not run: {skipped}")
    return 0 if report.ok else 1


def _dtypes(values: Optional[List[str]], flag: str) -> Optional[List[str]]:
    """``None`` (not given: the spec's or the default), ``[]`` for ``none``, else the names as given."""
    if values is None:
        return None
    if [v.strip().lower() for v in values] == ["none"]:
        return []
    from layerlab.mixed.dtypes import half_names

    return half_names(values, flag)


def _check_scale(value: float) -> None:
    import math

    from layerlab.errors import UsageError

    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"--tolerance-scale must be a finite number > 0, got {value!r}", where="--tolerance-scale",
                         expected="a finite number > 0", got=value)

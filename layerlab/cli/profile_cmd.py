"""``layerlab profile NAME|SPEC``: time, memory and FLOPs per module call, forward and backward.

Parse → :mod:`layerlab.profiling.run` → :mod:`layerlab.cli.render_profile`. Exit codes: 0 measured,
1 the model raised (or a requested comparison could not run), 2 bad usage or a bad spec.
"""

from __future__ import annotations

from typing import Optional

import typer
from typing import Annotated

from layerlab.backends import DEFAULT_COMPILE_BACKEND
from layerlab.cli.options import (CompileBackendOpt, DeviceOpt, DtypeOpt, InputShapeOpt, JsonOpt, ModeOpt, SeedOpt,
                                  ThreadsOpt, overrides)
from layerlab.cli.target_arg import AllowImportOpt, device_of, refuse_meta, resolve
from layerlab.errors import UsageError

TargetArg = Annotated[str, typer.Argument(
    metavar="NAME|SPEC", help="A layerlab registry name (transformer_encoder_layer) or a YAML spec.",
    show_default=False)]
RepeatsOpt = Annotated[int, typer.Option("--repeats", min=1, help="Timed rounds; medians are reported.")]
WarmupOpt = Annotated[int, typer.Option("--warmup", min=0, help="Untimed steps first.")]
CompileOpt = Annotated[bool, typer.Option("--compile", help="Also time torch.compile against eager.")]
VsReferenceOpt = Annotated[bool, typer.Option(
    "--vs-reference", help="Time the layer next to its torch.nn counterpart (the registry's, or the spec's "
    "reference:): throughput and memory side by side, with the ratio.")]
DepthOpt = Annotated[Optional[int], typer.Option("--depth", min=0, help="Fold modules nested deeper than N into their "
                                                 "parent row (root = 0).", show_default=False)]
TopOpt = Annotated[Optional[int], typer.Option("--top", min=1, help="Show only the N rows with the largest share.",
                                               show_default=False)]


def command(
    target: TargetArg,
    repeats: RepeatsOpt = 10,
    warmup: WarmupOpt = 3,
    compile: CompileOpt = False,
    compile_backend: CompileBackendOpt = DEFAULT_COMPILE_BACKEND,
    vs_reference: VsReferenceOpt = False,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    mode: ModeOpt = None,
    input_shape: InputShapeOpt = None,
    threads: ThreadsOpt = None,
    depth: DepthOpt = None,
    top: TopOpt = None,
    seed: SeedOpt = None,
    allow_import: AllowImportOpt = False,
    json: JsonOpt = False,
) -> int:
    """Time, memory and FLOPs per module call, forward and backward.

    Per module call: self time forward and backward, share of the step, FLOPs, activation and
    parameter memory; then the whole step and the profiler's own overhead.

    On CPU times are wall time; with [b]--device cuda[/] CUDA events, synchronised every step.

    [b]Examples[/b]

      layerlab profile transformer_encoder_layer --vs-reference
      layerlab profile model.yaml --depth 2 --repeats 20
      layerlab profile conv2d --compile --compile-backend inductor --json
    """
    from layerlab.cli.output import Output

    out = Output(json_mode=json)
    device_of(device)  # an absent or meta device is --device's fault, not the spec's
    options = overrides(device=device, dtype=dtype, seed=seed, mode=mode, input_shape=input_shape)
    resolved = resolve(target, options=options, allow_import=allow_import, reference=vs_reference)
    refuse_meta(resolved)
    reference = None
    if vs_reference:
        reference = resolved.reference
        if reference is None:
            raise UsageError(f"{resolved.target} has no torch.nn reference to compare with", where="--vs-reference",
                             hint="give a spec a reference: key (reference: nn.TransformerEncoderLayer)")
    from layerlab.profiling.run import profile_args

    from layerlab.cli.progress import steps

    with steps(out.err, "profile", json_mode=out.json_mode) as advance:
        report = profile_args(resolved.module, resolved.args, repeats=repeats, warmup=warmup, compile=compile,
                              compile_backend=compile_backend, reference=reference, threads=threads,
                              seed=resolved.seed, target=resolved.name, progress=advance)
    if out.json_mode:
        out.json(report)
    else:
        from layerlab.cli.render_profile import report as render

        out.show(*render(report, depth=depth, top=top))
    failed = [c.error for c in (report.compile, report.reference) if c is not None and c.error]
    for message in failed:
        out.warn(message)
    return 1 if failed else 0

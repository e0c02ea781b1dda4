"""``layerlab gradcheck NAME|SPEC|--all``: the checks that find real layer bugs, and where the bug is.

Parse → :mod:`layerlab.checks.targets` → :mod:`layerlab.cli.render_gradcheck`. Exit codes: 0 every check
passed (warnings and skips allowed), 1 a check failed, 2 bad usage or a bad spec.
"""

from __future__ import annotations

from typing import Optional

import typer
from typing import Annotated

from layerlab.cli.options import (CompileBackendOpt, DtypeOpt, InputShapeOpt, JsonOpt, ModeOpt, SeedOpt,
                                  overrides)
from layerlab.backends import DEFAULT_COMPILE_BACKEND
from layerlab.cli.parse import name_list
from layerlab.cli.target_arg import AllowImportOpt, check_target, one_target_only, refuse_meta, resolve

TargetArg = Annotated[Optional[str], typer.Argument(
    metavar="[NAME|SPEC]",
    help="A layerlab registry name (lstm, multihead_attention) or a YAML spec; omit it with --all.",
    show_default=False,
)]
AllOpt = Annotated[bool, typer.Option("--all", help="Every registry layer: a matrix of layers × checks.")]
DeepOpt = Annotated[bool, typer.Option(
    "--deep", help="Also gradgradcheck, non-contiguous inputs, determinism and torch.compile parity (slow).")]
OnlyOpt = Annotated[Optional[str], typer.Option(
    "--only", metavar="CHECKS", help="Run only these checks, comma-separated (forward_parity,gradcheck).",
    show_default=False)]
SlowCapOpt = Annotated[int, typer.Option(
    "--slow-cap", min=0, metavar="N",
    help="Largest Jacobian (elements) slow-mode gradcheck may build to confirm a failure.")]
NoAutoReferenceOpt = Annotated[bool, typer.Option(
    "--no-auto-reference",
    help="Without a reference, do not compare a layer that mirrors a torch.nn layer (MyGRUCell) with that layer.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show the numbers of passing checks too.")]


def command(
    target: TargetArg = None,
    all_layers: AllOpt = False,
    deep: DeepOpt = False,
    only: OnlyOpt = None,
    slow_cap: SlowCapOpt = 1_000_000,
    seed: SeedOpt = None,
    verbose: VerboseOpt = False,
    compile_backend: CompileBackendOpt = DEFAULT_COMPILE_BACKEND,
    input_shape: InputShapeOpt = None,
    mode: ModeOpt = None,
    dtype: DtypeOpt = None,
    no_auto_reference: NoAutoReferenceOpt = False,
    allow_import: AllowImportOpt = False,
    json: JsonOpt = False,
) -> int:
    """Verify a layer: parity with its reference, gradients, batch, causality, state and masks.

    [b]Examples[/b]

      layerlab gradcheck lstm
      layerlab gradcheck my_attention.yaml --allow-import
      layerlab gradcheck --all
      layerlab gradcheck multihead_attention --deep --json
    """
    from layerlab.cli.output import Output

    out = Output(json_mode=json)
    checks = name_list(only, "--only", "check name", "forward_parity,gradcheck")
    check_target("gradcheck", target, all_layers)
    if all_layers:
        one_target_only("gradcheck", input_shape=input_shape, mode=mode, dtype=dtype)
    from layerlab.checks import targets
    from layerlab.checks.run import VerifyOptions

    if checks is not None:
        VerifyOptions(only=checks).selected()  # unknown names: a usage error before any work
    if all_layers:
        return _run_all(out, deep=deep, seed=seed or 0, only=checks, slow_cap=slow_cap, verbose=verbose,
                        compile_backend=compile_backend)
    options = overrides(dtype=dtype, seed=seed, mode=mode, input_shape=input_shape)
    resolved = resolve(target, options=options, allow_import=allow_import, strict=True)
    refuse_meta(resolved)
    from layerlab.cli import render_gradcheck
    from layerlab.cli.progress import steps

    with steps(out.err, "checking", json_mode=out.json_mode) as advance:  # stderr: never mixed into stdout
        report = targets.verify_target(resolved, deep=deep, only=checks, slow_cap=slow_cap,
                                       compile_backend=compile_backend, auto_reference=not no_auto_reference,
                                       progress=advance)
    if out.json_mode:
        out.json(report)
    else:
        out.show(*render_gradcheck.report(report, verbose=verbose))
    return 0 if report.ok else 1


def _run_all(out, *, deep: bool, seed: int, only, slow_cap: int, verbose: bool, compile_backend: str) -> int:
    from layerlab import registry
    from layerlab.cli import render_gradcheck
    from layerlab.checks.targets import verify_all

    names = registry.names()
    from layerlab.cli.progress import steps
    from layerlab.run_manifest import remember_selection

    remember_selection("--all", names, seed)  # the --json manifest: no spec file, but the seed and the layers

    with steps(out.err, "gradcheck", json_mode=out.json_mode) as advance:
        matrix = verify_all(names, deep=deep, seed=seed, only=only, slow_cap=slow_cap, progress=advance,
                            compile_backend=compile_backend)
    if out.json_mode:
        out.json(matrix)
    else:
        out.show(*render_gradcheck.matrix(matrix, verbose=verbose))
    return 0 if matrix.ok else 1

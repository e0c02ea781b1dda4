"""``layerlab gradcheck NAME|SPEC|--all``: the checks that find real layer bugs, and where the bug is.

Parse → :mod:`layerlab.checks.targets` → :mod:`layerlab.cli.render_gradcheck`. Exit codes: 0 every check
passed (warnings and skips allowed), 1 a check failed, 2 bad usage or a bad spec.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from typing import Annotated

from layerlab.cli.options import JsonOpt, SeedOpt
from layerlab.errors import UsageError

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
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show the numbers of passing checks too.")]
CompileBackendOpt = Annotated[str, typer.Option(
    "--compile-backend", metavar="NAME",
    help="torch.compile backend of --deep's compile check (inductor compiles for real and can take a minute; "
         "aot_eager is quick).")]
AllowImportOpt = Annotated[bool, typer.Option(
    "--allow-import", help="Allow layers given as import paths in a spec (importing runs their code).")]


def command(
    target: TargetArg = None,
    all_layers: AllOpt = False,
    deep: DeepOpt = False,
    only: OnlyOpt = None,
    slow_cap: SlowCapOpt = 1_000_000,
    seed: SeedOpt = None,
    verbose: VerboseOpt = False,
    compile_backend: CompileBackendOpt = "inductor",
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
    checks = _only(only)
    if all_layers and target is not None:
        raise UsageError("give a layer or --all, not both", where="--all", got=target,
                         hint=f"layerlab gradcheck {target}  or  layerlab gradcheck --all")
    if not all_layers and target is None:
        raise UsageError("which layer?", where="NAME|SPEC", expected="a registry name, a spec file, or --all",
                         hint="layerlab gradcheck lstm  ·  layerlab gradcheck --all")
    from layerlab.checks import targets
    from layerlab.checks.run import VerifyOptions

    if checks is not None:
        VerifyOptions(only=checks).selected()  # unknown names: a usage error before any work
    if all_layers:
        return _run_all(out, deep=deep, seed=seed or 0, only=checks, slow_cap=slow_cap, verbose=verbose,
                        compile_backend=compile_backend)
    if _is_spec(target):
        if not Path(target).is_file():
            raise UsageError(f"no spec file {target!r}", where="SPEC", got=target,
                             hint="check the path, or give a registry name (layerlab gradcheck lstm)")
        report = targets.verify_spec(target, deep=deep, seed=seed, only=checks, slow_cap=slow_cap,
                                     allow_import=allow_import, compile_backend=compile_backend)
    else:
        from layerlab import registry

        registry.get(target)  # did-you-mean on a typo (exit 2)
        report = targets.verify_entry(target, deep=deep, seed=seed or 0, only=checks, slow_cap=slow_cap,
                                      compile_backend=compile_backend)
    if out.json_mode:
        out.json(report)
    else:
        from layerlab.cli import render_gradcheck

        out.show(*render_gradcheck.report(report, verbose=verbose))
    return 0 if report.ok else 1


def _is_spec(target: str) -> bool:
    path = Path(target)
    return path.suffix.lower() in (".yaml", ".yml") or path.is_file() or "/" in target or "\\" in target


def _only(text: Optional[str]) -> Optional[List[str]]:
    if text is None:
        return None
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise UsageError("--only needs at least one check name", where="--only", hint="--only forward_parity,gradcheck")
    return names


def _run_all(out, *, deep: bool, seed: int, only, slow_cap: int, verbose: bool, compile_backend: str) -> int:
    from layerlab import registry
    from layerlab.cli import render_gradcheck
    from layerlab.checks.targets import verify_all

    names = registry.names()
    with render_gradcheck.progress(out.err, total=len(names)) as advance:
        matrix = verify_all(names, deep=deep, seed=seed, only=only, slow_cap=slow_cap, progress=advance,
                            compile_backend=compile_backend)
    if out.json_mode:
        out.json(matrix)
    else:
        out.show(*render_gradcheck.matrix(matrix, verbose=verbose))
    return 0 if matrix.ok else 1

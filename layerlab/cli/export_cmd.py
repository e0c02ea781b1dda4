"""``layerlab export-check NAME|SPEC|--all``: does the layer survive trace, script, compile, export and ONNX?

Parse → :mod:`layerlab.deploy.run` → :mod:`layerlab.cli.render_export`. Exit codes: 0 no path
failed (warnings and skips allowed; with ``--strict`` a warning fails too), 1 a path failed,
2 bad usage or a bad spec.
"""

from __future__ import annotations

from typing import Optional

import typer
from typing import Annotated

from layerlab.backends import DEFAULT_COMPILE_BACKEND
from layerlab.cli.options import (AtolOpt, CompileBackendOpt, DeviceOpt, DtypeOpt, InputShapeOpt, JsonOpt, ModeOpt,
                                  RtolOpt, SeedOpt, overrides)
from layerlab.cli.parse import name_list
from layerlab.cli.target_arg import AllowImportOpt, TargetArg, check_target, device_of, one_target_only, refuse_meta, resolve

AllOpt = Annotated[bool, typer.Option("--all", help="Every registry layer: a matrix of layers × paths.")]
PathsOpt = Annotated[Optional[str], typer.Option(
    "--paths", metavar="PATHS",
    help="Run only these paths, comma-separated: trace, script, compile, export, export_dynamic, onnx.",
    show_default=False)]
StrictOpt = Annotated[bool, typer.Option("--strict", help="Exit 1 on warnings too (input-specific traces, graph breaks).")]


def command(
    target: TargetArg = None,
    all_layers: AllOpt = False,
    paths: PathsOpt = None,
    compile_backend: CompileBackendOpt = DEFAULT_COMPILE_BACKEND,
    strict: StrictOpt = False,
    rtol: RtolOpt = None,
    atol: AtolOpt = None,
    seed: SeedOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    mode: ModeOpt = None,
    input_shape: InputShapeOpt = None,
    allow_import: AllowImportOpt = False,
    json: JsonOpt = False,
) -> int:
    """Does the layer survive trace, script, compile, export and ONNX — and match eager?

    Tries torch.jit.trace, torch.jit.script, torch.compile(fullgraph=True), torch.export (static and
    with a dynamic batch) and ONNX → onnxruntime, and compares each program's outputs with eager's.

    A trace that baked in a shape or a Python branch is a [yellow]warning[/], not a pass: it is re-run
    at another batch size, length and sign of the inputs next to eager.

    [b]Examples[/b]

      layerlab export-check lstm
      layerlab export-check my_layer.yaml --paths trace,export
      layerlab export-check --all --json

    Exit codes: 0 no path failed, 1 a path failed (or warned, with --strict), 2 bad usage.
    """
    from layerlab.cli.output import Output

    out = Output(json_mode=json)
    check_target("export-check", target, all_layers)
    if all_layers:
        one_target_only("export-check", input_shape=input_shape, mode=mode, dtype=dtype)
    dev = device_of(device)
    from layerlab.deploy.run import check_all, check_target as run_target, select_paths

    selected = select_paths(name_list(paths, "--paths", "path name", "trace,export"))  # unknown names: a usage error before any work
    from layerlab.cli import render_export
    from layerlab.cli.progress import steps

    if all_layers:
        from layerlab import registry
        from layerlab.run_manifest import remember_selection

        names = registry.names()
        remember_selection("--all", names, seed or 0, dev)  # --json manifest: no spec file; seed, layers
        with steps(out.err, "export-check", json_mode=out.json_mode) as advance:
            matrix = check_all(names, paths=selected, compile_backend=compile_backend, seed=seed or 0,
                               progress=advance, device=dev)
        if out.json_mode:
            out.json(matrix)
        else:
            out.show(*render_export.matrix(matrix, strict=strict))
        _onnx_note(out, matrix.reports)
        return 0 if matrix.ok_for(strict) else 1
    options = overrides(device=device, dtype=dtype, seed=seed, mode=mode, input_shape=input_shape)
    resolved = resolve(target, options=options, allow_import=allow_import, reference=False)
    refuse_meta(resolved)
    with steps(out.err, "export-check", json_mode=out.json_mode) as advance:
        report = run_target(resolved, paths=selected, compile_backend=compile_backend, rtol=rtol, atol=atol,
                            progress=advance)
    if out.json_mode:
        out.json(report)
    else:
        out.show(*render_export.report(report, strict=strict))
    _onnx_note(out, [report])
    return 0 if report.ok_for(strict) else 1


def _onnx_note(out, reports) -> None:
    """Once, on stderr: the ONNX column was skipped because the extra is not installed."""
    from layerlab.deploy.onnx import INSTALL_HINT

    for r in reports:
        for p in r.paths:
            if p.path == "onnx" and p.details.get("missing"):
                out.warn(f"the ONNX column needs {' and '.join(p.details['missing'])}", hint=INSTALL_HINT)
                return

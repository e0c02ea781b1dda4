"""``layerlab diff A.json B.json``: what changed between two reports (before and after a refactor,
pre-LN against post-LN, torch 2.12 against 2.13).

Parse → :func:`layerlab.report_diff.diff` → :mod:`layerlab.cli.render_diff`. Never imports torch.
Exit codes, like ``diff``'s: 0 the results are the same within tolerance, 1 they differ, 2 bad
input (a missing file, not JSON, not a layerlab report, a newer schema, two kinds of report).
"""

from __future__ import annotations

from typing import Optional

import typer
from typing import Annotated

from layerlab.cli.options import AllowImportOpt, JsonOpt, _tolerance, checked

ReportArg = Annotated[str, typer.Argument(
    metavar="A.json", help="The first report (before): a --json file, or a YAML spec to inspect now.",
    show_default=False)]
OtherArg = Annotated[str, typer.Argument(
    metavar="B.json", help="The second report (after), of the same kind (or a YAML spec).", show_default=False)]
RtolOpt = Annotated[Optional[float], typer.Option(
    "--rtol", help="Relative tolerance: numbers differ when |a − b| > atol + rtol·max(|a|, |b|). Default 1e-4.",
    show_default=False, callback=checked(_tolerance))]
AtolOpt = Annotated[Optional[float], typer.Option(
    "--atol", help="Absolute tolerance (see --rtol). Default 1e-6.", show_default=False,
    callback=checked(_tolerance))]
TopOpt = Annotated[Optional[int], typer.Option(
    "--top", min=0, help="Show the N largest changes (default 25; 0: all of them).", show_default=False)]

DEFAULT_TOP = 25


def command(a: ReportArg, b: OtherArg, rtol: RtolOpt = None, atol: AtolOpt = None, top: TopOpt = None,
            allow_import: AllowImportOpt = False, json: JsonOpt = False) -> int:
    """Show what changed between two reports (or specs) of the same kind, largest change first.

    Module calls added or gone, shapes and dtypes, value statistics and gradient norms beyond a
    tolerance, new or gone warnings, probe results, and how the two runs were made differently
    (torch version, threads, device, seed, spec hash).

    A or B may be a YAML spec instead of a report: it is inspected now, as inspect would,
    so two specs compare in one command.

    Exit codes: 0 no differences beyond tolerance, 1 differences found, 2 bad input.

    [b]Examples[/b]

      layerlab inspect configs/transformer_preln.yaml --json > pre.json
      layerlab inspect configs/transformer_postln.yaml --json > post.json
      layerlab diff pre.json post.json --top 10
      layerlab diff configs/transformer_preln.yaml configs/transformer_postln.yaml
    """
    from layerlab.cli.output import Output
    from layerlab.report_diff import diff
    from layerlab.report_diff.numbers import DEFAULT_ATOL, DEFAULT_RTOL

    ra, rb = (_inspected(x, allow_import) if _is_spec(x) else x for x in (a, b))
    report = diff(ra, rb, rtol=DEFAULT_RTOL if rtol is None else rtol, atol=DEFAULT_ATOL if atol is None else atol)
    report.a, report.b = a, b
    out = Output(json_mode=json)
    if json:
        out.json(report)
    else:
        from layerlab.cli.render_diff import render

        out.show(*render(report, top=DEFAULT_TOP if top is None else (top or None)))
    return 1 if report.differs else 0


def _is_spec(path: str) -> bool:
    return path.lower().endswith((".yaml", ".yml"))


def _inspected(spec: str, allow_import: bool) -> dict:
    """``layerlab inspect SPEC --json``'s report, with its manifest, made in this process."""
    import sys

    from layerlab.cli.target_arg import resolve
    from layerlab.probe.run import inspect
    from layerlab.run_manifest import manifest
    from layerlab.serialize import to_jsonable

    target = resolve(spec, allow_import=allow_import, reference=False)
    pos, kw = target.split()
    report = inspect(target.module, *pos, backward=target.backward, seed=target.seed, mode=target.mode,
                     forward_kwargs=kw)
    data = to_jsonable(report)
    data["manifest"] = manifest(spec, module=target.module, inputs=target.values(), seed=target.seed,
                                command=["layerlab", *sys.argv[1:]])
    return data

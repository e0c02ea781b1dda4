"""``layerlab inspect SPEC.yaml``: build a layer from a spec, run it forward and backward, show every step.

The spec (or registry name) becomes a :class:`~layerlab.target.Target` the way it does for every
command, so a gradcheck spec (``reference:``, ``tags:``, ``batch_dims:``) runs here unchanged: inspect
uses the module and its inputs and does not build the reference.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from typing import Annotated

from layerlab.cli import inspect_plot
from layerlab.cli.options import (AllowImportOpt, DeviceOpt, DtypeOpt, ForceOpt, InputShapeOpt, JsonOpt, ModeOpt,
                                  SeedOpt, overrides)
from layerlab.errors import CheckFailed

SpecArg = Annotated[str, typer.Argument(
    metavar="SPEC",
    help="A YAML spec (see the README, 'The YAML spec'), or a layerlab registry name such as conv2d.",
    show_default=False,
)]
BackwardOpt = Annotated[bool, typer.Option("--backward/--no-backward", help="Run backward too (default: yes).")]
DepthOpt = Annotated[Optional[int], typer.Option("--depth", min=0, help="Fold modules nested deeper than N (root = 0).")]
SvgOpt = Annotated[Optional[Path], typer.Option("--svg", help="Also save what is shown as SVG.", dir_okay=False)]
HtmlOpt = Annotated[Optional[Path], typer.Option("--html", help="Also save what is shown as HTML.", dir_okay=False)]
WideOpt = Annotated[bool, typer.Option(
    "--wide", help="Forward table with every field in its own column (all inputs, dtype, device, "
                   "requires_grad, grad_fn, params, NaN, Inf, ...), wider than 100 columns: for wide "
                   "terminals, less -S, --svg/--html.",
)]
OpsOpt = Annotated[bool, typer.Option(
    "--ops", help="Also record every torch function and tensor method the model's own code calls "
                  "(transpose, view, cat, +, matmul, masked_fill …), shown under their module's row.",
)]
ProbeOpt = Annotated[Optional[List[str]], typer.Option(
    "--probe", metavar="NAME[,NAME]",
    help="Probes to run beside the recording: attention, sparsity, dead, rank (and init, steps, histogram), "
         "or a custom probe module:function (module, inputs, output) -> dict of numbers, which needs "
         "--allow-import. Added to the spec's probes: section. Repeatable.",
    show_default=False,
)]
FixOpt = Annotated[bool, typer.Option(
    "--fix/--no-fix", help="When the forward raises, re-run it on a copy to trace the bad input back and "
                           "to verify the suggested fix (default: yes).",
)]
def command(
    spec: SpecArg,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    seed: SeedOpt = None,
    input_shape: InputShapeOpt = None,
    mode: ModeOpt = None,
    backward: BackwardOpt = True,
    depth: DepthOpt = None,
    wide: WideOpt = False,
    ops: OpsOpt = False,
    fix: FixOpt = True,
    json: JsonOpt = False,
    svg: SvgOpt = None,
    html: HtmlOpt = None,
    force: ForceOpt = False,
    allow_import: AllowImportOpt = False,
    probe: ProbeOpt = None,
    meta: Annotated[bool, typer.Option(
        "--meta", help="Shape-only dry run on torch's meta device (any model size, no weights allocated): "
                       "shapes, dtypes, parameter counts and estimated memory per layer; no statistics.",
    )] = False,
    plot: inspect_plot.PlotOpt = None,
    compare: inspect_plot.CompareOpt = None,
    plot_histograms: inspect_plot.HistogramsOpt = None,
    steps: Annotated[bool, typer.Option(
        "--steps", help="Recurrent layers over time (= --probe steps): per time step, the hidden-state norm, the "
                        "gradient norm reaching the step's input and, for layerlab's own cells, gate saturation.",
    )] = False,
) -> int:
    """Run a layer or block forward and backward; show every step, and where and why it breaks.

    Every step's shapes, values, gradients and formula checks — and, when it breaks, the module or
    op that broke, the cause and a fix (verified on a copy where it is mechanical).

    Exit codes: 0 all good, 1 the layer raised or a check failed, 2 bad spec or options.
    """
    from layerlab.cli.output import Output, check_writable
    from layerlab.cli.target_arg import device_of, resolve

    device_of(device)  # an absent or meta device is --device's fault, not the spec's
    if not json:  # under --json nothing is drawn, so nothing is saved (a warning says so below)
        check_writable(svg, "--svg")  # before the run, not after it
        check_writable(html, "--html")
    inspect_plot.check(plot, plot_histograms, compare, meta)  # before the run, like --svg/--html
    options = overrides(device=device, dtype=dtype, seed=seed, mode=mode, input_shape=input_shape,
                        backward=None if backward else False, meta=meta)  # --meta: built without weights
    outputs = [("--svg", None if json else svg), ("--html", None if json else html), ("--plot", plot),
               ("--plot-histograms", plot_histograms)]
    _check_outputs(outputs, spec, compare, None, force)  # before the model is built (and runs)
    target = resolve(spec, options=options, allow_import=allow_import, reference=False)
    _check_outputs(outputs, spec, compare, target, force)  # and its source files, now known
    from layerlab.arguments import check_not_meta

    if not meta:  # --meta runs on meta twins of the model on purpose
        check_not_meta(target.module, target.values(), where=f"{target.name} (device: meta)")
    other = inspect_plot.compare_target(compare, options, allow_import) if compare else None  # refused before any run

    from layerlab.probe.run import inspect

    pos, kw = target.split()
    report = inspect(
        target.module, *pos, backward=target.backward, seed=target.seed, mode=target.mode,
        forward_kwargs=kw, ops=ops, fix=fix, meta=meta,
        probes=_probes(target, probe, allow_import, steps=steps, histograms=plot_histograms),
    )
    out = Output(json_mode=json, record=bool(svg or html))
    compared = inspect_plot.run_compare(other, compare, ops, fix, out) if other is not None else None
    pictures = inspect_plot.draw(report, inspect_plot.label_of(target, spec), plot, plot_histograms, compared, out,
                                 inline=bool(html) and not json, force=force)
    if json:
        out.json(report)
    else:
        from layerlab.cli.render_inspect import WideForward, render

        console = out.out
        normal = widest = console.width
        from layerlab.spec.limits import clean_text

        title = target.title or f"layerlab inspect {clean_text(spec)}"  # a file name may hold ESC sequences
        for part in render(report, depth=depth, title=title, wide=wide):
            if isinstance(part, WideForward):  # whole, lines longer than the terminal, rather than squeezed
                console.width = widest = max(normal, part.width_needed(console))
                out.show(part)
                console.width = normal
            else:
                out.show(part)
        if report.memory is not None:
            from layerlab.cli.render_meta import memory_table

            out.show(memory_table(report, depth))
        if svg:
            console.width = widest  # the SVG is as wide as its widest line
            out.save_svg(str(svg), title=f"layerlab inspect {spec}", force=force)
            console.width = normal
        if html:
            out.save_html(str(html), force=force)
            inspect_plot.embed(html, pictures, force=force)
    if json and (svg or html):
        out.warn("--svg/--html save the human view; with --json nothing was drawn, so nothing was saved")
    if not report.ok:
        out.error(_verdict(report))
        return 1
    return 0


def _check_outputs(outputs: list, spec: str, compare: Optional[str], target, force: bool) -> None:
    """Before the run: no output over an input (the spec, --compare's, the model's source files once
    ``target`` is built), no two outputs with one path, no symbolic link unless --force
    (layerlab.output_files)."""
    import os

    from layerlab.output_files import check_outputs, source_files

    inputs = [p for p in (spec, compare) if p and os.path.isfile(p)]
    if target is not None:
        inputs += source_files(target.module.modules())
    check_outputs(outputs, inputs, force=force)


def _probes(target, option, allow_import: bool, steps: bool, histograms) -> Optional[list]:
    """The spec's ``probes:`` section, then ``--probe``'s, then those ``--steps`` and ``--plot-histograms``
    ask for (a name given twice runs once); ``None`` when there are none (no probe code runs)."""
    found: list = []
    if "probes" in target.sections or option:
        from layerlab.probe.probes.spec import from_option, from_section

        if "probes" in target.sections:
            found += from_section(target.sections["probes"], target.marks, allow_import, target.base_dir)
        found += from_option(option, allow_import)
    found += inspect_plot.probes_for(histograms) or []
    return found + (["steps"] if steps else []) or None


def _verdict(report) -> CheckFailed:
    """The closing error: it stands alone (``--json`` has no panel above it to point to)."""
    f = report.failure
    if f is not None:
        from layerlab.cli.render_inspect import verification_text

        d = f.diagnosis
        who = f.class_name or "the model"
        at = f" at {f.op.op} ({f.op.source})" if f.op is not None and f.op.source else ""
        message = f"{who} raised {f.exception} in the {f.phase}{at}: " + (
            d.message if d is not None else _first_line(f.message))
        hint = None
        if d is not None and d.hint:
            hint = d.hint
            if d.verified is not None:
                hint += f" (verified on a copy: {verification_text(d.verified)})"
        elif d is None:
            hint = "no rule recognises this failure; torch's message: " + _first_line(f.message)
        return CheckFailed(
            message, where=f.path or None,
            expected=d.expected if d else None, got=d.got if d else None, hint=hint,
        )
    failed = report.checks_failed
    if failed:
        c = failed[0]
        return CheckFailed(f"{len(failed)} formula check(s) failed, first at {c.path}", where=c.path,
                           expected=c.predicted, got=c.actual, hint=c.note)
    p = report.errors[0]
    return CheckFailed(p.message, where=p.where, hint=p.hint)


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else ""

"""``inspect --plot PATH``, ``--compare SPEC2`` and ``--plot-histograms PATH``: pictures of the run.

* ``--plot flow.svg`` saves the gradient-flow chart (:mod:`layerlab.plot.flow_chart`);
  ``--compare SPEC2`` inspects a second spec with the same options and draws it beside the first
  (pre-LN next to post-LN), each column titled with its spec's ``name:``.
* ``--plot-histograms hist.png`` runs the ``histogram`` probe and saves one panel per layer.

Pictures are files of their own, so they are saved under ``--json`` too; with ``--html`` they are
also inlined (as SVG) in the HTML report. Everything that can be refused (a suffix other than
.svg/.png, an unwritable path, matplotlib missing, ``--meta``, ``--compare`` without ``--plot``)
is refused before anything runs, as a usage error (exit 2).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, List, Optional, Tuple

import typer
from typing import Annotated

from layerlab.errors import UsageError

PlotOpt = Annotated[Optional[Path], typer.Option(
    "--plot", dir_okay=False, show_default=False,
    help="Save the gradient-flow chart (gradient norm, weight norm and output std of every layer, by depth) "
         "as .svg or .png; needs matplotlib: pip install 'layerlab[plot]'.",
)]
CompareOpt = Annotated[Optional[str], typer.Option(
    "--compare", metavar="SPEC2", show_default=False,
    help="Also inspect SPEC2 (same options) and draw it beside SPEC in the --plot chart, e.g. pre-LN vs post-LN.",
)]
HistogramsOpt = Annotated[Optional[Path], typer.Option(
    "--plot-histograms", dir_okay=False, show_default=False,
    help="Run the histogram probe and save each layer's output-value histogram, one panel per layer "
         "(.svg or .png; needs matplotlib).",
)]


def check(plot: Optional[Path], histograms: Optional[Path], compare: Optional[str], meta: bool) -> None:
    """Refuse, before the run, every picture option that cannot work."""
    if compare is not None and plot is None:
        raise UsageError("--compare draws SPEC2 beside SPEC in the --plot chart, and no --plot was given",
                         where="--compare", hint="add --plot PATH.svg (or .png)")
    wanted = [(flag, path) for flag, path in (("--plot", plot), ("--plot-histograms", histograms)) if path]
    if not wanted:
        return
    if meta:
        raise UsageError(f"{wanted[0][0]} draws gradient norms and value statistics, and a --meta run has none",
                         where=wanted[0][0], hint="drop --meta to draw the picture")
    from layerlab.cli.output import check_writable
    from layerlab.plot.backend import format_of, matplotlib_or_error

    for flag, path in wanted:
        format_of(path, flag)
        check_writable(path, flag)
    matplotlib_or_error(wanted[0][0])


def probes_for(histograms: Optional[Path]) -> List[str]:
    """The probes the picture options need (``histogram`` for ``--plot-histograms``)."""
    return ["histogram"] if histograms else []


def label_of(target: Any, spec: str) -> str:
    from layerlab.spec.limits import clean_text

    return clean_text(target.title or spec)


def compare_target(compare: str, options: Any, allow_import: bool) -> Any:
    """SPEC2 built and checked as SPEC is, before either runs: a bad spec, or a bad ``probes:`` section
    (an unknown probe, a wrong type, an import without ``--allow-import``), is refused (exit 2) with
    SPEC2's ``file:line:col`` rather than ignored.

    Built with :func:`layerlab.target.build.resolve` rather than the CLI's ``resolve``, so that the
    ``--json`` manifest keeps recording SPEC, the run it reports. SPEC2's probes are checked, not run:
    the chart draws gradient norms and output statistics, which no probe changes.
    """
    from layerlab.arguments import check_not_meta
    from layerlab.target.build import resolve

    target = resolve(compare, overrides=options, allow_import=allow_import, reference=False)
    if "probes" in target.sections:
        from layerlab.probe.probes.spec import from_section

        from_section(target.sections["probes"], target.marks, allow_import, target.base_dir)
    check_not_meta(target.module, target.values(), where=f"{target.name} (device: meta)")
    return target


def run_compare(target: Any, compare: str, ops: bool, fix: bool, out: Any) -> Tuple[str, Any]:
    """Inspect SPEC2 (built by :func:`compare_target`) as SPEC was; ``(label, report)``."""
    from layerlab.probe.run import inspect

    pos, kw = target.split()
    report = inspect(target.module, *pos, backward=target.backward, seed=target.seed, mode=target.mode,
                     forward_kwargs=kw, ops=ops, fix=fix)
    if not report.ok:
        out.warn(f"--compare {compare}: the run did not pass (the chart shows what it recorded)",
                 hint=f"layerlab inspect {compare} shows why")
    return label_of(target, compare), report


def draw(report: Any, label: str, plot: Optional[Path], histograms: Optional[Path],
         compared: Optional[Tuple[str, Any]], out: Any, inline: bool, force: bool = False) -> List[str]:
    """Save the pictures asked for; return them as SVG text when ``inline`` (for ``--html``).

    When the model raised, a picture that cannot be drawn becomes a warning: the failure is the
    message that matters. Otherwise "nothing to draw" is a usage error.
    """
    from layerlab.plot import backend
    from layerlab.plot.flow_chart import gradient_flow
    from layerlab.plot.histogram_chart import histograms as draw_histograms

    svgs: List[str] = []
    jobs = []
    if plot:
        reports, labels = [report], [label]
        if compared is not None:
            other_label, other = compared
            reports.append(other)
            labels.append(other_label if other_label != label else f"{other_label} (2)")
        jobs.append(("--plot", plot, lambda: gradient_flow(*reports, labels=labels)))
    if histograms:
        jobs.append(("--plot-histograms", histograms, lambda: draw_histograms(report, label=label)))
    for flag, path, make in jobs:
        try:
            figure = make()
        except UsageError as exc:
            if report.ok:
                exc.where = flag
                raise
            out.warn(f"{flag}: {exc.message}; no picture saved")
            continue
        backend.save(figure, path, flag, force=force)
        if inline:
            svgs.append(backend.svg_text(figure))
    return svgs


def embed(html_path: Path, svgs: List[str], force: bool = False) -> None:
    """Inline ``svgs`` in the HTML report already saved at ``html_path``."""
    if not svgs:
        return
    from layerlab.output_files import write_output
    from layerlab.report_render import embed_pictures

    path = Path(html_path)
    if force and path.is_symlink():
        path = Path(os.path.realpath(path))
    write_output(path, embed_pictures(path.read_text(encoding="utf-8"), svgs), flag="--html", force=force)

"""Render any layerlab report as the CLI shows it: text, Rich renderables or HTML.

The CLI and Python share one renderer, so ``print(report)`` in a script, a report in a notebook
cell and ``layerlab inspect`` on a terminal show the same tables::

    import layerlab
    report = layerlab.inspect(model, x)
    print(layerlab.render(report, width=100, depth=2))   # the tables as plain text
    report                                               # in Jupyter: the tables as HTML
    print(report)                                        # the same as layerlab.render(report)

Reports accepted: :class:`~layerlab.probe.report.InspectReport` (``layerlab.inspect``),
:class:`~layerlab.checks.report.VerifyReport` and ``MatrixReport`` (``layerlab.verify``),
:class:`~layerlab.profiling.report.ProfileReport` (``layerlab.profile``),
:class:`~layerlab.deploy.report.ExportReport` and ``ExportMatrix`` (``layerlab.export_check``).
Their JSON (``--json``, ``to_dict``) is unchanged by any of this.

Rich is imported only when something is rendered; importing this module (which every report
module does, for :class:`Displayable`) costs nothing. ``layerlab.render`` and
``layerlab.render_html`` are this module's functions (the module is not called ``render`` so
that importing it can never shadow the function on the package).
"""

from __future__ import annotations

from typing import Any, List, Optional

__all__ = ["render", "renderables", "render_html", "embed_pictures", "Displayable"]


def renderables(report: Any, *, depth: Optional[int] = None, wide: bool = False,
                verbose: bool = False) -> List[Any]:
    """The Rich renderables the CLI prints for ``report``, in order.

    Args:
        report: a report returned by ``layerlab.inspect``, ``verify``, ``profile``, ``export_check``,
            ``train_check``, ``precision_check``, ``ddp_check`` or ``diff``.
        depth (int, optional): fold modules nested deeper than ``depth`` (root = 0), as
            ``--depth``; identical blocks below it become one row. Default: every module.
        wide (bool): ``inspect``'s forward table with every field in its own column (``--wide``).
        verbose (bool): ``verify``/``export_check``: the numbers of passing checks too.

    Raises:
        TypeError: ``report`` is not a layerlab report.
    """
    kind = type(report).__name__
    if kind == "InspectReport":
        from layerlab.cli.render_inspect import render as inspect_parts

        return inspect_parts(report, depth=depth, wide=wide)
    if kind == "VerifyReport":
        from layerlab.cli import render_gradcheck

        return render_gradcheck.report(report, verbose=verbose)
    if kind == "MatrixReport":
        from layerlab.cli import render_gradcheck

        return render_gradcheck.matrix(report, verbose=verbose)
    if kind == "ProfileReport":
        from layerlab.cli import render_profile

        return render_profile.report(report, depth=depth)
    if kind == "ExportReport":
        from layerlab.cli import render_export

        return render_export.report(report)
    if kind == "ExportMatrix":
        from layerlab.cli import render_export

        return render_export.matrix(report, verbose=verbose)
    if kind == "TrainReport":
        from layerlab.cli import render_train

        return render_train.report(report)
    if kind == "PrecisionReport":
        from layerlab.cli import render_precision

        return render_precision.report(report, depth=depth)
    if kind == "DdpReport":
        from layerlab.cli import render_ddp

        return render_ddp.report(report)
    if kind == "DiffReport":
        from layerlab.cli import render_diff

        return render_diff.render(report)
    raise TypeError(f"layerlab.render takes a layerlab report (from inspect, verify, profile, export_check, "
                    f"train_check, precision_check, ddp_check or diff), "
                    f"got {kind}")


def _console(width: int, color: bool, record: bool = False):
    from layerlab.text_safety import safe_console_class

    return safe_console_class()(width=width, record=record, highlight=False, soft_wrap=False, force_terminal=color,
                   color_system="truecolor" if color else None, force_jupyter=False, file=_Null())


class _Null:
    """Where a recording console writes: nowhere (what it drew is exported instead)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def render(report: Any, width: int = 100, *, depth: Optional[int] = None, wide: bool = False,
           verbose: bool = False, color: bool = False) -> str:
    """The report as the CLI prints it, laid out for ``width`` columns, as a string.

    A number is never cut: where the columns don't fit, names are shortened first and then
    secondary columns left out. ``color=True`` keeps the ANSI colours. ``depth``, ``wide`` and
    ``verbose`` as in :func:`renderables`.
    """
    if width < 20:
        raise ValueError(f"width must be at least 20 columns, got {width}")
    console = _console(width, color, record=True)
    for part in renderables(report, depth=depth, wide=wide, verbose=verbose):
        console.print(part)
    return console.export_text(styles=color)


def render_html(report: Any, width: int = 100, *, depth: Optional[int] = None, wide: bool = False,
                verbose: bool = False) -> str:
    """The report as an HTML fragment (a ``<pre>`` with inline styles): what a notebook shows."""
    console = _console(width, True, record=True)
    for part in renderables(report, depth=depth, wide=wide, verbose=verbose):
        console.print(part)
    return console.export_html(inline_styles=True, code_format="<pre style=\"font-family:monospace;"
                                                               "line-height:1.2\">{code}</pre>")


def embed_pictures(html: str, svgs: List[str]) -> str:
    """``html`` (a saved report) with each SVG picture inlined, in order, before ``</body>``.

    The pictures' XML prolog and DOCTYPE are dropped (an inline ``<svg>`` needs neither); an HTML
    fragment without ``</body>`` gets them appended.
    """
    figures = []
    for svg in svgs:
        start = svg.find("<svg")
        body = svg[start:] if start >= 0 else svg
        figures.append(f'<figure style="margin:1em 0">{body.strip()}</figure>')
    block = "\n".join(figures) + "\n"
    at = html.rfind("</body>")
    return html[:at] + block + html[at:] if at >= 0 else html + block


class Displayable:
    """Mixed into every report dataclass: it shows itself as the CLI's tables.

    ``print(report)`` prints the tables (100 columns), a Rich console prints them at its own
    width (``__rich__``), a notebook shows them as HTML (``_repr_html_``), and ``repr`` stays one
    short line. The report's fields and JSON are untouched.
    """

    __slots__ = ()

    def __str__(self) -> str:
        return render(self)

    def __rich__(self):
        from rich.console import Group

        return Group(*renderables(self))

    def _repr_html_(self) -> str:
        return render_html(self)

    def __repr__(self) -> str:
        verdict = getattr(self, "ok", None)
        name = next((getattr(self, a) for a in ("model", "module", "target", "name") if getattr(self, a, None)), "")
        state = "" if verdict is None else (" ok" if verdict else " FAILED")
        return f"<{type(self).__name__} {name}{state}: print() it for the tables, .to_dict() for the data>"

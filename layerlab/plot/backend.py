"""matplotlib, imported only when a picture is drawn, and the one place pictures are saved.

matplotlib is an optional extra (``pip install 'layerlab[plot]'``): nothing in layerlab imports it
at ``import layerlab`` or ``layerlab --help`` time. When it is missing, :func:`matplotlib_or_error`
raises a :class:`~layerlab.errors.UsageError` (exit 2) that names the install command.

Figures are made with ``matplotlib.figure.Figure`` directly, never through ``pyplot``: drawing a
report changes no global state (no backend switch, no figure left open in a notebook), and saving
uses the file format's own canvas (Agg for PNG, the SVG writer for SVG). Every figure is drawn and
saved under matplotlib's default style, so a user's ``matplotlibrc`` does not change it, and saved
files are reproducible: the SVG ids come from a fixed ``svg.hashsalt`` and no date is written, so
the same report gives the same bytes (with the same matplotlib and fonts).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from layerlab.errors import UsageError

__all__ = ["FORMATS", "INSTALL_HINT", "matplotlib_or_error", "style", "new_figure", "save", "svg_text",
           "format_of"]

#: file suffix -> the format matplotlib writes
FORMATS = {".svg": "svg", ".png": "png"}
INSTALL_HINT = "pip install 'layerlab[plot]'  (or: pip install 'matplotlib>=3.7')"

#: written into every saved file instead of the date and the matplotlib version
_SVG_METADATA = {"Date": None, "Creator": "layerlab"}
_PNG_METADATA = {"Software": "layerlab"}


def matplotlib_or_error(flag: str = "plot"):
    """The ``matplotlib`` module, or a UsageError naming the install command when it is missing."""
    try:
        import matplotlib
        from matplotlib.figure import Figure  # noqa: F401 (a broken install fails here, not later)
    except ImportError as exc:
        raise UsageError(
            f"{flag} draws with matplotlib, which is not installed", where=flag,
            expected="matplotlib>=3.7", got=f"ImportError: {exc}", hint=INSTALL_HINT,
        ) from None
    return matplotlib


def format_of(path: Union[str, Path], flag: str = "plot") -> str:
    """``"svg"`` or ``"png"`` from ``path``'s suffix; any other suffix is a UsageError."""
    suffix = Path(path).suffix.lower()
    fmt = FORMATS.get(suffix)
    if fmt is None:
        raise UsageError(f"{flag}: cannot tell the picture's format from {str(path)!r}", where=flag,
                         expected=" or ".join(FORMATS), got=suffix or "(no suffix)",
                         hint=f"name the file with one of these suffixes, e.g. {Path(path).stem or 'flow'}.svg")
    return fmt


@contextlib.contextmanager
def style() -> Iterator[None]:
    """matplotlib's default style with a fixed SVG hash salt, for drawing and saving alike; no text
    is read as mathtext (``$…$`` in a name or title is shown literally, and cannot make drawing
    raise)."""
    mpl = matplotlib_or_error()
    with mpl.rc_context():
        mpl.rcdefaults()  # inside the context: restored on the way out
        mpl.rcParams["svg.hashsalt"] = "layerlab"
        mpl.rcParams["svg.fonttype"] = "none"  # text stays text: small, searchable, diffable files
        mpl.rcParams["text.parse_math"] = False  # a module name "cost $x$" is shown as typed, not as TeX
        yield


def new_figure(width: float, height: float):
    """A ``Figure`` (not registered with pyplot) of ``width`` x ``height`` inches."""
    matplotlib_or_error()
    from matplotlib.figure import Figure

    with style():
        return Figure(figsize=(width, height), dpi=100, layout="constrained")


def save(figure: Any, path: Union[str, Path], flag: str = "plot", force: bool = False) -> Path:
    """Write ``figure`` to ``path`` (SVG or PNG, from the suffix) all at once
    (:func:`layerlab.output_files.write_output`: no partial file, no writing through a link unless
    ``force``); returns the path."""
    from layerlab.output_files import write_output

    fmt = format_of(path, flag)

    def draw(f: Any) -> None:
        with style():
            figure.savefig(f, format=fmt, metadata=_SVG_METADATA if fmt == "svg" else _PNG_METADATA)

    write_output(path, draw, flag=flag, force=force)
    return Path(path)


def svg_text(figure: Any) -> str:
    """``figure`` as an SVG document (for inlining in an HTML report)."""
    buffer = io.StringIO()
    with style():
        figure.savefig(buffer, format="svg", metadata=_SVG_METADATA)
    return buffer.getvalue()


def no_picture(reason: str, flag: Optional[str] = None) -> UsageError:
    """The error for a report that holds nothing to draw (``reason`` says why)."""
    return UsageError(f"nothing to draw: {reason}", where=flag or "plot")

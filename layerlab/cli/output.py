"""The one output sink of the CLI.

Data goes to stdout; warnings, errors and hints go to stderr — in human mode (Rich) and in JSON
mode alike, so ``layerlab … --json | jq`` always sees clean JSON. Only this module and the
renderers in :mod:`layerlab.cli.render` know about Rich; Rich itself is imported lazily.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any, Optional

from layerlab.errors import LayerlabError, debug_enabled
from layerlab.serialize import dumps


class Output:
    """Where a command writes. ``json_mode`` switches stdout from Rich to JSON.

    ``record=True`` keeps what was shown so it can be saved with :meth:`save_svg` /
    :meth:`save_html`.
    """

    def __init__(self, json_mode: bool = False, record: bool = False) -> None:
        self.json_mode = json_mode
        self._record = record
        self._out = None
        self._err = None

    @property
    def out(self):
        if self._out is None:
            from rich.console import Console

            self._out = Console(file=sys.stdout, record=self._record, highlight=False)
        return self._out

    @property
    def err(self):
        if self._err is None:
            from rich.console import Console

            self._err = Console(file=sys.stderr, highlight=False)
        return self._err

    # -- data ------------------------------------------------------------------------------------
    def show(self, *renderables: Any) -> None:
        """Print Rich renderables (human mode only)."""
        for r in renderables:
            self.out.print(r)

    def json(self, obj: Any) -> None:
        """Print ``obj`` as JSON on stdout."""
        sys.stdout.write(dumps(obj) + "\n")
        sys.stdout.flush()

    def save_svg(self, path: str, title: str = "layerlab") -> None:
        self.out.save_svg(path, title=title, clear=False)

    def save_html(self, path: str) -> None:
        self.out.save_html(path, clear=False)

    # -- messages on stderr ------------------------------------------------------------------------
    def warn(self, message: str, hint: Optional[str] = None) -> None:
        if self.json_mode:
            sys.stderr.write(dumps({"warning": message, "hint": hint}) + "\n")
            return
        from rich.markup import escape

        self.err.print(f"[yellow]warning:[/] {escape(message)}")
        if hint:
            self.err.print(f"  [cyan]hint:[/] {escape(hint)}")

    def error(self, exc: LayerlabError) -> None:
        """One readable message for a known error: what, where, expected vs got, the fix."""
        if self.json_mode:
            sys.stderr.write(dumps(exc.to_dict()) + "\n")
            return
        from rich.markup import escape

        err = self.err
        where = f" [dim]({escape(exc.where)})[/]" if exc.where else ""
        if exc.kind == "usage":
            # Malformed flags: one line, the fix after a dash.
            hint = f" — {escape(exc.hint)}" if exc.hint else ""
            err.print(f"[bold red]error:[/] {escape(exc.message)}{where}{hint}", soft_wrap=True)
            return
        err.print(f"[bold red]error:[/] {escape(exc.message)}{where}", soft_wrap=True)
        if exc.expected is not None or exc.got is not None:
            err.print(f"  expected: {escape(str(exc.expected))}", soft_wrap=True)
            err.print(f"  got:      {escape(str(exc.got))}", soft_wrap=True)
        if exc.hint:
            err.print(f"  [cyan]hint:[/] {escape(exc.hint)}", soft_wrap=True)


def print_known_error(exc: LayerlabError, json_mode: bool) -> None:
    """Render a known error; with LAYERLAB_DEBUG=1 print its traceback first."""
    if debug_enabled():
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    Output(json_mode=json_mode).error(exc)

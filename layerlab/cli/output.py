"""The one output sink of the CLI.

Data goes to stdout; warnings, errors and hints go to stderr — in human mode (Rich) and in JSON
mode alike, so ``layerlab … --json | jq`` always sees clean JSON. Only this module and the
renderers in :mod:`layerlab.cli.render` know about Rich; Rich itself is imported lazily.
"""

from __future__ import annotations

import errno
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Optional

from layerlab.errors import LayerlabError, UsageError, debug_enabled
from layerlab.serialize import dumps, to_jsonable


def json_line(obj: Any) -> str:
    """One message on stderr under ``--json``: compact JSON on one line, so that a run's stderr is
    a stream of JSON lines (warnings, then the error) that reads line by line."""
    import json

    return json.dumps(to_jsonable(obj), ensure_ascii=False)


def _console(**kwargs: Any):
    """A Rich console that lets a closed stdout (``| head``) reach the error boundary as
    ``BrokenPipeError`` (Rich's own handler would exit 1 on the spot)."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, "stdout was closed by its reader")

    return _Console(**kwargs)


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
            self._out = _console(file=sys.stdout, record=self._record, highlight=False)
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
        """Print ``obj`` as JSON on stdout, with the run's manifest (:mod:`layerlab.run_manifest`:
        versions, device, dtype, threads, seed, the spec's hash) added under ``"manifest"``, so every
        command's report can be compared with ``layerlab diff``."""
        data = to_jsonable(obj)
        if isinstance(data, dict) and "manifest" not in data:
            from layerlab.run_manifest import cli_manifest

            data = {**data, "manifest": cli_manifest()}
        sys.stdout.write(dumps(data) + "\n")
        sys.stdout.flush()

    def save_svg(self, path: str, title: str = "layerlab", flag: str = "--svg") -> None:
        try:
            self.out.save_svg(path, title=title, clear=False)
        except OSError as exc:  # checked before the run (check_writable), but a disk can fill up
            raise _unwritable(flag, path, exc) from None

    def save_html(self, path: str, flag: str = "--html") -> None:
        try:
            self.out.save_html(path, clear=False)
        except OSError as exc:
            raise _unwritable(flag, path, exc) from None

    # -- messages on stderr ------------------------------------------------------------------------
    def warn(self, message: str, hint: Optional[str] = None) -> None:
        if self.json_mode:
            sys.stderr.write(json_line({"warning": message, "hint": hint}) + "\n")
            return
        from rich.markup import escape

        self.err.print(f"[yellow]warning:[/] {escape(message)}")
        if hint:
            self.err.print(f"  [cyan]hint:[/] {escape(hint)}")

    def error(self, exc: LayerlabError) -> None:
        """One readable message for a known error: what, where, expected vs got, the fix."""
        if self.json_mode:
            sys.stderr.write(json_line(exc.to_dict()) + "\n")
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
        if exc.expected is not None:  # a side nobody knows is left out, not printed as "None"
            err.print(f"  expected: {escape(str(exc.expected))}", soft_wrap=True)
        if exc.got is not None:
            err.print(f"  got:      {escape(str(exc.got))}", soft_wrap=True)
        if exc.hint:
            err.print(f"  [cyan]hint:[/] {escape(exc.hint)}", soft_wrap=True)


def print_known_error(exc: LayerlabError, json_mode: bool) -> None:
    """Render a known error; with LAYERLAB_DEBUG=1 print its traceback first."""
    if debug_enabled():
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    Output(json_mode=json_mode).error(exc)


def check_writable(path: Optional[Path], flag: str, _again: bool = True) -> None:
    """Refuse, before any work, a ``--svg``/``--html`` path that cannot be written: a missing
    directory, a device or other non-regular file (``/dev/full``), a file system that takes no new
    files (``/proc``), no permission. Nothing is left behind: a probe file is removed again, and an
    existing file is opened for appending, never truncated. A file another process creates between
    the two looks (two runs writing the same plot) is checked as the existing file it now is."""
    if path is None:
        return
    p = Path(path)
    try:
        exists = p.exists()
    except OSError as exc:  # ENAMETOOLONG and the like: Path.exists raises them on Python 3.11
        raise _unwritable(flag, str(p), exc) from None
    if exists:
        if not p.is_file():
            raise UsageError(f"{flag}: {str(p)!r} is not a regular file", where=flag, got=str(p),
                             hint="give the path of a file to create or overwrite")
        try:
            os.close(os.open(p, os.O_WRONLY | os.O_APPEND))
        except FileNotFoundError as exc:  # removed by another process since: check it as a new file
            if _again:
                return check_writable(path, flag, _again=False)
            raise _unwritable(flag, str(p), exc) from None
        except OSError as exc:
            raise _unwritable(flag, str(p), exc) from None
        return
    parent = p.parent
    if not parent.is_dir():
        raise UsageError(f"{flag}: the directory {str(parent)!r} does not exist", where=flag, got=str(p),
                         hint="create it first, or save somewhere else")
    try:
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        if _again:
            return check_writable(path, flag, _again=False)
        raise _unwritable(flag, str(p), FileExistsError(errno.EEXIST, "created and removed by another process "
                                                        "while checking")) from None
    except OSError as exc:
        raise _unwritable(flag, str(p), exc) from None
    try:
        os.unlink(p)
    except FileNotFoundError:  # another process's check removed it first
        pass


def _unwritable(flag: str, path: str, exc: OSError) -> LayerlabError:
    reason = exc.strerror or type(exc).__name__
    return UsageError(f"{flag}: cannot write {path!r}: {reason}", where=flag, got=path,
                      hint="choose a path in a directory you can write to")

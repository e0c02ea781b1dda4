"""The one output sink of the CLI.

Data goes to stdout; warnings, errors and hints go to stderr — in human mode (Rich) and in JSON
mode alike, so ``layerlab … --json | jq`` always sees clean JSON. Only this module and the
renderers in :mod:`layerlab.cli.render` know about Rich; Rich itself is imported lazily.

What reaches the terminal is safe to show, whatever the model is (:mod:`layerlab.text_safety`):

* text from data enters Rich markup only through :func:`layerlab.text_safety.escape`, and JSON
  leaves through :func:`layerlab.serialize.dumps`; both clean it;
* as a second line of defence, the consoles here show any control character still in the text
  they write as an escape (:func:`~layerlab.text_safety.safe_console_class`) — Rich's own colour
  codes are not text and pass;
* under ``--json`` the command runs inside :func:`streams` with stdout pointed at stderr (Python's
  ``sys.stdout`` and file descriptor 1, so a ``print`` in the model's ``forward`` or in a library
  lands on stderr), and :meth:`Output.json` writes the one JSON document to the real stdout;
* in human mode a Python warning the model raises is shown on one line, cleaned
  (:func:`_show_warning`);
* stdout that cannot be written — a full disk (``> /dev/full``), an I/O error — ends in one line
  on stderr and exit 1 (:func:`stdout_failed`); a closed pipe stays quiet (see
  :mod:`layerlab.cli.boundary`).
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any, Optional

from layerlab.errors import LayerlabError, UsageError, debug_enabled
from layerlab.serialize import dumps, to_jsonable
from layerlab.text_safety import clean, escape, safe_console_class


def json_line(obj: Any) -> str:
    """One message on stderr under ``--json``: compact JSON on one line, so that a run's stderr is
    a stream of JSON lines (warnings, then the error) that reads line by line."""
    return dumps(obj, indent=None)


def _console(**kwargs: Any):
    """A Rich console that lets a closed stdout (``| head``) reach the error boundary as
    ``BrokenPipeError`` (Rich's own handler would exit 1 on the spot)."""
    class _Console(safe_console_class()):
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
            self._err = safe_console_class()(file=sys.stderr, highlight=False)
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
        stream = _data_stdout or sys.stdout
        text = dumps(data)
        try:
            text.encode(getattr(stream, "encoding", None) or "utf-8")
        except (LookupError, UnicodeEncodeError):  # stdout is not UTF-8 (LANG=C): \u escapes are JSON too
            import json

            text = json.dumps(json.loads(text), indent=2, ensure_ascii=True)
        stream.write(text + "\n")
        stream.flush()

    def save_svg(self, path: str, title: str = "layerlab", flag: str = "--svg", force: bool = False) -> None:
        """What was shown, as SVG, written all at once (layerlab.output_files: no partial file, no link)."""
        from layerlab.output_files import write_output

        write_output(path, self.out.export_svg(title=title, clear=False), flag=flag, force=force)

    def save_html(self, path: str, flag: str = "--html", force: bool = False) -> None:
        from layerlab.output_files import write_output

        write_output(path, self.out.export_html(clear=False), flag=flag, force=force)

    # -- messages on stderr ------------------------------------------------------------------------
    def warn(self, message: str, hint: Optional[str] = None) -> None:
        if self.json_mode:
            sys.stderr.write(json_line({"warning": message, "hint": hint}) + "\n")
            return
        self.err.print(f"[yellow]warning:[/] {escape(message)}")
        if hint:
            self.err.print(f"  [cyan]hint:[/] {escape(hint)}")

    def error(self, exc: LayerlabError) -> None:
        """One readable message for a known error: what, where, expected vs got, the fix."""
        if self.json_mode:
            sys.stderr.write(json_line(exc.to_dict()) + "\n")
            return
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


#: where :meth:`Output.json` writes while :func:`streams` points stdout at stderr (else ``sys.stdout``)
_data_stdout: Optional[Any] = None


@contextlib.contextmanager
def streams(json_mode: bool):
    """Around one command: under ``--json`` everything but the JSON document goes to stderr — the
    model's ``print``, a library's output, a child process's, on ``sys.stdout`` and on file
    descriptor 1 alike — so that stdout is exactly one JSON document; in human mode, Python
    warnings are shown cleaned (a warning's text is the model's)."""
    if not json_mode:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            yield
        return
    global _data_stdout
    real, saved_fd = sys.stdout, None
    try:
        if real.fileno() == 1:
            real.flush()
            saved_fd = os.dup(1)
            os.dup2(sys.stderr.fileno(), 1)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):  # a test's captured stdout
        saved_fd = None
    data = (io.TextIOWrapper(io.FileIO(saved_fd, "w", closefd=False), encoding=getattr(real, "encoding", None),
                             errors=getattr(real, "errors", None), line_buffering=False)
            if saved_fd is not None else real)
    _data_stdout, sys.stdout = data, sys.stderr
    try:
        yield
    finally:
        sys.stdout, _data_stdout = real, None
        if saved_fd is not None:
            with contextlib.suppress(OSError, ValueError):  # a closed or full stdout was reported already
                data.flush()
            with contextlib.suppress(OSError, ValueError):
                data.detach()
            os.dup2(saved_fd, 1)
            os.close(saved_fd)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """:func:`warnings.showwarning` for human mode: ``file:line: Category: message`` on one line,
    every part cleaned."""
    stream = file or sys.stderr
    if stream is None:
        return
    with contextlib.suppress(OSError, ValueError):
        stream.write(f"{clean(filename)}:{lineno}: {clean(getattr(category, '__name__', category))}: "
                     f"{clean(message)}\n")


#: errno values that mean stdout cannot take more output (full disk, I/O error, quota)
_WRITE_FAILED = {errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG}


def stdout_failed(exc: OSError) -> Optional[int]:
    """For an ``OSError`` raised by writing output: one line on stderr and the exit code (1), with
    stdout pointed at ``/dev/null`` so the interpreter's last flush cannot fail again; ``None``
    when ``exc`` is not such an error (a bug keeps its traceback)."""
    if exc.errno not in _WRITE_FAILED:
        return None
    reason = exc.strerror or type(exc).__name__
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"error: cannot write the output: {clean(reason)} — free some space or write "
                         f"somewhere else\n")
        sys.stderr.flush()
    _silence_stdout()
    return 1


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass

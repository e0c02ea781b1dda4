"""The CLI's one error boundary: what reaches the user when a command ends other than normally.

Every command is registered through :func:`guarded`, and :func:`layerlab.cli.app.main` runs the
parsing around it through :func:`report`, so the same rules hold for every command, under
``main`` and under typer's ``CliRunner`` alike:

* a :class:`~layerlab.errors.LayerlabError` → one message on stderr (one JSON object under
  ``--json``) and its exit code: 2 bad usage or input, 1 a check failed; ``LAYERLAB_DEBUG=1``
  prints its traceback first;
* Ctrl-C → :class:`~layerlab.errors.Interrupted`, exit 130; the model's own ``sys.exit`` or
  ``KeyboardInterrupt``, and ``--timeout`` (every command has it), → exit 1 naming where
  (:mod:`layerlab.faults` tells a real Ctrl-C apart by the signal);
* stdout that cannot be written (``> /dev/full``) → one line on stderr, exit 1;
* stdout closed by its reader (``layerlab … | head``) → no message, exit 141 (128 + SIGPIPE, what
  a shell reports for a Unix tool that SIGPIPE ended); stdout is pointed at ``/dev/null`` so the
  interpreter's last flush cannot fail again;
* Python warnings (torch's ``UserWarning``\\ s) under ``--json`` → one JSON object per distinct
  warning on stderr, so every stderr line of a ``--json`` run parses;
* anything else is a bug in layerlab and keeps its traceback.

A command's ``int`` return value is its exit code here too (typer's standalone mode would
otherwise turn ``return 1`` into exit 0).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import warnings
from typing import Any, Callable, List, Optional

import typer

from layerlab.errors import EXIT_BROKEN_PIPE, Interrupted, LayerlabError

#: At most this many distinct warnings are passed on under --json; the rest are counted.
MAX_WARNINGS = 20


def guarded(command: Callable[..., Any], name: str = "") -> Callable[..., Any]:
    """Wrap a typer command in the boundary (the signature stays the command's: typer reads it), and
    give it ``--timeout SECONDS`` unless it has its own (ddp-check's is the collectives' timeout):
    the command runs under :func:`layerlab.faults.run_guard` (see :func:`with_timeout`)."""
    own_timeout = "timeout" in inspect.signature(command).parameters

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        timeout = None if own_timeout else kwargs.pop("timeout", None)
        code = call(lambda: command(*args, **kwargs), json_mode=bool(kwargs.get("json")), command=name,
                    timeout=timeout)
        if code:
            raise typer.Exit(code)
        return 0

    if not own_timeout:
        with_timeout(run, command)
    return run


def with_timeout(run: Callable[..., Any], command: Callable[..., Any]) -> None:
    """Add the shared ``--timeout`` option to ``run``'s signature (typer reads ``__signature__``)."""
    from layerlab.cli.options import RunTimeoutOpt

    sig = inspect.signature(command, eval_str=True)  # the Annotated options as objects, as typer reads them
    extra = inspect.Parameter("timeout", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=RunTimeoutOpt)
    run.__signature__ = sig.replace(parameters=[*sig.parameters.values(), extra])
    run.__annotations__ = {**getattr(command, "__annotations__", {}), "timeout": RunTimeoutOpt}


def call(fn: Callable[[], Any], *, json_mode: bool, command: str = "", timeout: Optional[float] = None) -> int:
    """Run ``fn`` inside the boundary; return its exit code (an ``int`` result, else 0).

    The model's ``sys.exit`` / ``KeyboardInterrupt`` and ``--timeout`` are told apart from a real
    Ctrl-C by :func:`layerlab.faults.run_guard` (exit 1; Ctrl-C 130)."""
    from layerlab.cli.output import stdout_failed, streams
    from layerlab.faults import run_guard

    error: Optional[LayerlabError] = None
    try:
        with json_warnings(json_mode), streams(json_mode):  # under --json the model's prints go to stderr
            try:
                with run_guard(command or "the command", timeout, hard_exit=True):
                    rv = fn()
                return rv if isinstance(rv, int) and not isinstance(rv, bool) else 0
            except LayerlabError as exc:
                error = exc
            except KeyboardInterrupt:
                error = Interrupted("interrupted (Ctrl-C)")
    except BrokenPipeError:
        return broken_pipe()
    except OSError as exc:  # stdout to a full disk (> /dev/full): one line, exit 1
        code = stdout_failed(exc)
        if code is None:
            raise
        return code
    return report(error, json_mode)


def report(error: LayerlabError, json_mode: bool) -> int:
    """Print a known error (after its warnings) and return its exit code."""
    from layerlab.cli.output import print_known_error

    try:
        print_known_error(error, json_mode)
    except BrokenPipeError:  # stderr gone too: nothing left to tell
        return broken_pipe()
    return error.exit_code


def broken_pipe() -> int:
    """The reader of stdout went away: stop quietly (see the module docstring)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout is not a file (a test's capture)
        pass
    return EXIT_BROKEN_PIPE


@contextlib.contextmanager
def json_warnings(json_mode: bool):
    """Under ``--json``, turn Python warnings into JSON lines on stderr (each distinct one once)."""
    if not json_mode:
        yield
        return
    stderr = sys.stderr
    sys.stderr = _JsonLines(stderr)  # what libraries log in plain text (transformers' logger) becomes JSON
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # once per place, as Python shows them by default
        try:
            yield
        finally:
            sys.stderr.flush()
            sys.stderr = stderr
            _emit(caught)


class _JsonLines:
    """A stderr that passes JSON lines through and wraps every other line as ``{"log": line}``:
    a library's logging handler, made while the command runs, writes plain text to ``sys.stderr``."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.pending = stream, ""

    def write(self, text: str) -> int:
        self.pending += text
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            self._line(line)
        return len(text)

    def _line(self, line: str) -> None:
        from layerlab.cli.output import json_line

        if not line.strip():
            return
        stripped = line.strip()
        if stripped.startswith("{") and stripped.endswith("}"):
            self.stream.write(line + "\n")
        else:
            self.stream.write(json_line({"log": stripped, "category": "log", "where": None, "hint": None}) + "\n")

    def flush(self) -> None:
        if self.pending:
            line, self.pending = self.pending, ""
            self._line(line)
        self.stream.flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _emit(caught: List[warnings.WarningMessage]) -> None:
    from layerlab.cli.output import json_line

    seen = set()
    lines = []
    for w in caught:
        key = (w.category.__name__, str(w.message))
        if key in seen:
            continue
        seen.add(key)
        lines.append({"warning": str(w.message), "category": w.category.__name__,
                      "where": f"{w.filename}:{w.lineno}", "hint": None})
    for line in lines[:MAX_WARNINGS]:
        sys.stderr.write(json_line(line) + "\n")
    if len(lines) > MAX_WARNINGS:
        sys.stderr.write(json_line({"warning": f"{len(lines) - MAX_WARNINGS} more distinct warning(s) not shown",
                                "category": None, "where": None, "hint": None}) + "\n")

"""The ``layerlab`` Typer app and its error boundary.

Commands live one per module in :mod:`layerlab.cli`; importing them must stay cheap (no torch at
module level) so ``layerlab --help`` and ``layerlab explain-shape`` start instantly.

The error boundary is :mod:`layerlab.cli.boundary`: every command is registered through
:func:`~layerlab.cli.boundary.guarded`, and :func:`main` applies the same rules to what happens
around a command (click's parsing: a malformed option exits 2, as one JSON object under ``--json``).
In short: a :class:`~layerlab.errors.LayerlabError` becomes one readable message on stderr and its
exit code (2 bad usage/input, 1 check failed), Ctrl-C exits 130, a closed stdout (``| head``)
exits 141 quietly; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

try:  # typer ≥ 0.26 ships its own copy of click
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover - older typer uses the click package
    from click.exceptions import ClickException
from typing import Annotated

from layerlab._version import __version__
from layerlab.cli import (ddp_cmd, diff_cmd, explain_shape, export_cmd, gradcheck_cmd, inspect_cmd, list_cmd,
                          precision_cmd, profile_cmd, train_cmd)
from layerlab.cli.boundary import broken_pipe, guarded, report
from layerlab.cli.help_text import reflow
from layerlab.errors import Interrupted, LayerlabError, UsageError

app = typer.Typer(
    name="layerlab",
    help="Make PyTorch layers stop being black boxes: shapes, gradients, formulas and failures.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"layerlab {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version_callback, is_eager=True, help="Show the version and exit."),
    ] = False,
) -> None:
    """layerlab: inspect, explain and verify PyTorch layers."""


def _register(name: str, command, no_args_is_help: bool = True) -> None:
    app.command(name, help=reflow(command.__doc__), no_args_is_help=no_args_is_help)(guarded(command, name))


_register("explain-shape", explain_shape.command, no_args_is_help=False)
_register("inspect", inspect_cmd.command)
_register("gradcheck", gradcheck_cmd.command)
_register("export-check", export_cmd.command)
_register("profile", profile_cmd.command)
_register("train-check", train_cmd.command)
_register("precision-check", precision_cmd.command)
_register("ddp-check", ddp_cmd.command)
_register("diff", diff_cmd.command)
_register("list", list_cmd.command, no_args_is_help=False)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the CLI and return its exit code (the console script's entry point)."""
    args = list(sys.argv[1:] if argv is None else argv)
    json_mode = "--json" in args
    _never_raise_on_encoding()
    from layerlab.run_manifest import begin_run

    begin_run(args)  # the --json manifest records this command line (and no earlier command's target)
    try:
        rv = typer.main.get_command(app).main(args=args, prog_name="layerlab", standalone_mode=False)
    except LayerlabError as exc:  # raised while parsing (an option's callback), before the command ran
        return report(exc, json_mode)
    except typer.Exit as exc:
        return exc.exit_code
    except ClickException as exc:
        if json_mode:
            param = getattr(exc, "param", None)  # a bad value: name its option, as layerlab's own errors do
            where = param.opts[0] if param is not None and getattr(param, "opts", None) else None
            return report(UsageError(exc.format_message(), where=where), json_mode)
        from layerlab.text_safety import clean

        message = exc.format_message()  # it quotes the command line: a file name may hold ESC sequences
        exc.format_message = lambda: clean(message)
        exc.show()
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        return report(Interrupted("interrupted (Ctrl-C)"), json_mode)
    except BrokenPipeError:
        return broken_pipe()
    except OSError as exc:  # the help to a full disk (> /dev/full): one line, exit 1
        from layerlab.cli.output import stdout_failed

        code = stdout_failed(exc)
        if code is None:
            raise
        return code
    except SystemExit as exc:
        # a closed stdout while the help is printed (``layerlab --help | head``): Rich's console (and
        # click, for plain output) answers the BrokenPipeError with SystemExit(1); it is a broken pipe
        if isinstance(exc.__context__, BrokenPipeError) or type(sys.stdout).__name__ == "PacifyFlushWrapper":
            return broken_pipe()
        raise
    return rv if isinstance(rv, int) else 0


def _never_raise_on_encoding() -> None:
    """A character stdout/stderr's encoding cannot show (``LANG=C``, ``PYTHONIOENCODING=ascii``) is
    written as its ``\\u`` escape rather than ending the run in a ``UnicodeEncodeError``."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):  # not a TextIOWrapper (a test's capture)
            pass


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

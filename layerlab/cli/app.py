"""The ``layerlab`` Typer app and its error boundary.

Commands live one per module in :mod:`layerlab.cli`; importing them must stay cheap (no torch at
module level) so ``layerlab --help`` and ``layerlab explain-shape`` start instantly.

The boundary (:func:`main`): a :class:`~layerlab.errors.LayerlabError` becomes one readable
message on stderr and its exit code (2 bad usage/input, 1 check failed); click's usage errors
exit 2; anything else is a bug and keeps its traceback.
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
from layerlab.cli import explain_shape, export_cmd, gradcheck_cmd, inspect_cmd, profile_cmd
from layerlab.errors import LayerlabError

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


app.command("explain-shape", no_args_is_help=False)(explain_shape.command)
app.command("inspect", no_args_is_help=True)(inspect_cmd.command)
app.command("gradcheck", no_args_is_help=True)(gradcheck_cmd.command)
app.command("export-check", no_args_is_help=True)(export_cmd.command)
app.command("profile", no_args_is_help=True)(profile_cmd.command)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the CLI and return its exit code (the console script's entry point)."""
    args = list(sys.argv[1:] if argv is None else argv)
    json_mode = "--json" in args
    try:
        rv = typer.main.get_command(app).main(args=args, prog_name="layerlab", standalone_mode=False)
    except LayerlabError as exc:
        from layerlab.cli.output import print_known_error

        print_known_error(exc, json_mode)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except ClickException as exc:
        if json_mode:
            from layerlab.errors import UsageError
            from layerlab.cli.output import print_known_error

            print_known_error(UsageError(exc.format_message()), json_mode)
        else:
            exc.show()
        return exc.exit_code
    except typer.Abort:
        sys.stderr.write("Aborted.\n")
        return 130
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

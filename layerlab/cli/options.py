"""Option aliases shared by every command, declared once (``Annotated`` + ``typer.Option``).

Values with limits (``--seed``, ``--threads``, ``--rtol``/``--atol``) are checked while the command
line is parsed, by the same functions the Python API uses (:mod:`layerlab.arguments`), so a bad
value is a usage error naming its option (exit 2) before any work, never an overflow inside torch.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import typer
from typing import Annotated



def checked(check: Callable[[Any, str], None]) -> Callable[[Any, Any, Any], Any]:
    """A click callback running ``check(value, "--option")``. Its :class:`UsageError` (``where`` the
    option, expected, got, hint) leaves the parser as it is and reaches the error boundary in
    :func:`layerlab.cli.app.main`: exit 2, one message, one JSON object under ``--json``."""

    def callback(ctx: Any, param: Any, value: Any) -> Any:
        if value is not None:
            check(value, param.opts[0] if param.opts else param.name)
        return value

    return callback


def _seed(value: int, flag: str) -> None:
    from layerlab.arguments import check_seed

    check_seed(value, flag)


def _threads(value: int, flag: str) -> None:
    from layerlab.arguments import check_threads

    check_threads(value, flag)


def _tolerance(value: float, flag: str) -> None:
    from layerlab.arguments import check_tolerance

    check_tolerance(value, flag)


JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print the result as JSON on stdout (for scripts and CI).")
]
DeviceOpt = Annotated[
    Optional[str], typer.Option("--device", help="Run on this device (cpu, cuda, cuda:1, mps).")
]
DtypeOpt = Annotated[
    Optional[str], typer.Option("--dtype", help="Floating dtype: float32, float64, float16, bfloat16.")
]
SeedOpt = Annotated[Optional[int], typer.Option(
    "--seed", help="Random seed for weights and inputs (0 … 2**63 − 1).", callback=checked(_seed))]
ThreadsOpt = Annotated[Optional[int], typer.Option(
    "--threads", help="torch intra-op threads while measuring (at most 4 per CPU core).", show_default=False,
    callback=checked(_threads))]
RtolOpt = Annotated[Optional[float], typer.Option(
    "--rtol", help="Relative tolerance of output comparisons (finite, ≥ 0).", show_default=False,
    callback=checked(_tolerance))]
AtolOpt = Annotated[Optional[float], typer.Option(
    "--atol", help="Absolute tolerance of output comparisons (finite, ≥ 0).", show_default=False,
    callback=checked(_tolerance))]

"""Option aliases shared by every command, declared once (``Annotated`` + ``typer.Option``).

Values with limits (``--seed``, ``--threads``, ``--rtol``/``--atol``) are checked while the command
line is parsed, by the same functions the Python API uses (:mod:`layerlab.arguments`), so a bad
value is a usage error naming its option (exit 2) before any work, never an overflow inside torch.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

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


ForceOpt = Annotated[bool, typer.Option(
    "--force", help="Write output files through a symbolic link (refused otherwise).")]
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
def _run_timeout(value: float, flag: str) -> None:
    from layerlab.faults import check_timeout

    check_timeout(value, flag)


#: every command's --timeout (added by layerlab.cli.boundary.guarded; ddp-check's own means its collectives')
RunTimeoutOpt = Annotated[Optional[float], typer.Option(
    "--timeout", metavar="SECONDS", show_default=False, callback=checked(_run_timeout),
    help="Stop the run after this many seconds, naming the step it was in (exit 1). Default: no limit.")]
AtolOpt = Annotated[Optional[float], typer.Option(
    "--atol", help="Absolute tolerance of output comparisons (finite, ≥ 0).", show_default=False,
    callback=checked(_tolerance))]


# -- what every command that runs a target shares ---------------------------------------------------

def train_or_eval(value: Optional[str], flag: str = "--mode") -> Optional[str]:
    """``--mode``: ``train``, ``eval`` or ``None`` (the spec's)."""
    from layerlab.errors import UsageError

    if value is not None and value not in ("train", "eval"):
        raise UsageError(f"{flag} must be train or eval, got {value!r}", where=flag, expected="train | eval",
                         got=value)
    return value


def _backend(value: str, flag: str) -> None:
    from layerlab.backends import check_backend

    check_backend(value, flag)


InputShapeOpt = Annotated[Optional[List[str]], typer.Option(
    "--input-shape", help="Replace an input's shape: 2,3,32,32 (the first input) or query=2,10,64. Repeatable.",
    show_default=False)]
ModeOpt = Annotated[Optional[str], typer.Option(
    "--mode", help="train or eval (the spec's mode otherwise; default train).", show_default=False)]
AllowImportOpt = Annotated[bool, typer.Option(
    "--allow-import", help="Allow layers given as import paths in a spec (my_module:MyLayer): importing runs their code.")]
CompileBackendOpt = Annotated[str, typer.Option(
    "--compile-backend", metavar="NAME", callback=checked(_backend),
    help="torch.compile backend (every command: gradcheck --deep, export-check, profile --compile). "
         "aot_eager captures the whole graph and traces forward and backward in seconds with no C++ "
         "compiler; inductor also generates code (tens of seconds per layer on CPU, needs a compiler).")]


def floating_dtype(value: Optional[str], flag: str = "--dtype") -> Optional[str]:
    """``--dtype`` → the spec's dtype name (``float32``, ``bfloat16``; aliases as a spec takes them)."""
    if value is None:
        return None
    from layerlab.errors import UsageError
    from layerlab.spec.schema import DTYPE_ALIASES, FLOAT_DTYPES, did_you_mean

    name = DTYPE_ALIASES.get(value.strip(), value.strip()).replace("torch.", "")
    if name not in FLOAT_DTYPES:
        raise UsageError(f"{flag} must be a floating dtype, got {value!r}", where=flag,
                         expected=", ".join(FLOAT_DTYPES), got=value, hint=did_you_mean(name, FLOAT_DTYPES))
    return name


def input_shapes(values: Optional[List[str]]) -> List[Tuple[Optional[str], List[int]]]:
    """``--input-shape`` values → ``[(input name or None for the first input, dims)]``."""
    from layerlab.cli.parse import int_tuple

    out = []
    for text in values or []:
        name, sep, body = text.partition("=")
        if not sep:
            name, body = None, text
        dims = int_tuple(body, "--input-shape", minimum=0, what="a tensor shape like 2,3,32,32",
                         examples=("2,3,32,32", "query=3,10,64"))
        out.append((name.strip() if name else None, list(dims) if isinstance(dims, tuple) else [dims]))
    return out


def overrides(*, device: Optional[str] = None, dtype: Optional[str] = None, seed: Optional[int] = None,
              mode: Optional[str] = None, input_shape: Optional[List[str]] = None, backward: Optional[bool] = None,
              meta: bool = False):
    """The shared options as :class:`~layerlab.spec.Overrides`: they reach a registry layer and a spec alike.

    Checked here, inside the command (so through its error boundary), before anything is built."""
    from layerlab.spec import Overrides

    return Overrides(device=device, dtype=floating_dtype(dtype), seed=seed, mode=train_or_eval(mode),
                     backward=backward, meta=meta,
                     input_shapes=input_shapes(input_shape))

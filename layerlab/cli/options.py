"""Option aliases shared by every command, declared once (``Annotated`` + ``typer.Option``)."""

from __future__ import annotations

from typing import Optional

import typer
from typing import Annotated

JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print the result as JSON on stdout (for scripts and CI).")
]
DeviceOpt = Annotated[
    Optional[str], typer.Option("--device", help="Run on this device (cpu, cuda, cuda:1, mps).")
]
DtypeOpt = Annotated[
    Optional[str], typer.Option("--dtype", help="Floating dtype: float32, float64, float16, bfloat16.")
]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", help="Random seed for weights and inputs.")]

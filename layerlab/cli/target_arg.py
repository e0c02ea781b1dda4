"""The TARGET argument that export-check and profile share with gradcheck: NAME | SPEC | --all.

Only usage checks live here (both or neither given, a missing file, a registry typo → exit 2);
building is :mod:`layerlab.checks.resolve`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from typing import Annotated

from layerlab.checks.resolve import to_device  # noqa: F401 - the commands import it from here
from layerlab.errors import UsageError

TargetArg = Annotated[Optional[str], typer.Argument(
    metavar="[NAME|SPEC]",
    help="A layerlab registry name (lstm, conv2d) or a YAML spec; omit it with --all.",
    show_default=False,
)]
AllowImportOpt = Annotated[bool, typer.Option(
    "--allow-import", help="Allow layers given as import paths in a spec (importing runs their code).")]


def check_target(command: str, target: Optional[str], all_layers: bool) -> None:
    """Exactly one of TARGET and --all (exit 2 otherwise)."""
    if all_layers and target is not None:
        raise UsageError("give a layer or --all, not both", where="--all", got=target,
                         hint=f"layerlab {command} {target}  or  layerlab {command} --all")
    if not all_layers and target is None:
        raise UsageError("which layer?", where="NAME|SPEC", expected="a registry name, a spec file, or --all",
                         hint=f"layerlab {command} lstm  ·  layerlab {command} --all")


def resolve(target: str, *, seed: Optional[int], allow_import: bool, strict: bool = False,
            example: str = "lstm, conv2d"):
    """Build TARGET (a spec file or a registry name) → :class:`~layerlab.checks.resolve.Resolved`.

    ``strict``: check the spec keys only gradcheck reads (see :func:`~layerlab.checks.resolve.resolve_spec`);
    ``example``: the registry name the missing-file hint suggests.
    """
    from layerlab.checks.resolve import is_spec_path, resolve_entry, resolve_spec

    if is_spec_path(target):
        if not Path(target).is_file():
            raise UsageError(f"no spec file {target!r}", where="SPEC", got=target,
                             hint=f"check the path, or give a registry name ({example})")
        return resolve_spec(target, seed=seed, allow_import=allow_import, strict=strict)
    return resolve_entry(target, seed=seed or 0)


def device_of(name: Optional[str]):
    """``--device`` → ``torch.device`` (``None`` keeps the spec's); unknown or absent devices exit 2."""
    if name is None:
        return None
    import torch

    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UsageError(f"unknown device {name!r}", where="--device", expected="cpu, cuda, cuda:1, mps",
                         got=name) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda, but CUDA is not available here", where="--device", got=name,
                         hint="run on a machine with a GPU, or drop --device")
    return dev

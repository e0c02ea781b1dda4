"""The TARGET argument every command shares: NAME | SPEC (| --all for gradcheck and export-check).

Only usage checks live here (both or neither given, an unavailable ``--device`` → exit 2); building,
and the hints for a missing file or an unknown name, are :mod:`layerlab.target.build`'s.
"""

from __future__ import annotations

from typing import Any, List, Optional

import typer
from typing import Annotated

from layerlab.cli.options import AllowImportOpt  # noqa: F401 - the commands import it from here
from layerlab.errors import UsageError

TargetArg = Annotated[Optional[str], typer.Argument(
    metavar="[NAME|SPEC]",
    help="A layerlab registry name (lstm, conv2d) or a YAML spec; omit it with --all.",
    show_default=False,
)]


def check_target(command: str, target: Optional[str], all_layers: bool) -> None:
    """Exactly one of TARGET and --all (exit 2 otherwise)."""
    if all_layers and target is not None:
        raise UsageError("give a layer or --all, not both", where="--all", got=target,
                         hint=f"layerlab {command} {target}  or  layerlab {command} --all")
    if not all_layers and target is None:
        raise UsageError("which layer?", where="NAME|SPEC", expected="a registry name, a spec file, or --all",
                         hint=f"layerlab {command} lstm  ·  layerlab {command} --all")


def one_target_only(command: str, **given: Any) -> None:
    """Options that shape one target's build (``--input-shape``, ``--mode``, ``--dtype``) make no sense
    across every registry layer: a usage error with ``--all`` (exit 2)."""
    used = [f"--{k.replace('_', '-')}" for k, v in given.items() if v]
    if used:
        raise UsageError(f"{', '.join(used)} shape(s) one layer's build, not every layer's", where=used[0],
                         hint=f"give one layer: layerlab {command} NAME|SPEC {used[0]} …")


def resolve(target: str, *, options: Any = None, allow_import: bool = False, strict: bool = False,
            reference: bool = True):
    """Build TARGET (a spec file or a registry name) → :class:`~layerlab.target.Target`, with the shared
    options (:func:`layerlab.cli.options.overrides`) applied to either.

    ``strict``: check the spec keys only gradcheck reads (see :func:`~layerlab.target.build.from_spec`);
    ``reference=False``: the command never uses the reference, so it is not built. A missing file or
    an unknown name is a usage error whose hint names what exists (``configs/…``, a registry name).
    """
    from layerlab.run_manifest import remember_target
    from layerlab.target.build import resolve as build

    built = build(target, overrides=options, allow_import=allow_import, strict=strict, reference=reference)
    remember_target(target, built)  # the --json manifest records its spec hash, seed, dtype, device
    return built


def device_of(name: Optional[str]):
    """``--device`` → ``torch.device`` (``None`` keeps the spec's), checked before any work.

    An unknown name, a device this machine lacks (``mps``, ``xla``, ``cuda`` without CUDA, ``cuda:3``
    with one GPU) and ``meta`` (no values to compute with) are usage errors naming ``--device`` and
    the devices there are, exit 2.
    """
    if name is None:
        return None
    import torch

    from layerlab.arguments import META_HINT, META_MESSAGE

    here = ", ".join(available_devices())
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        raise UsageError(f"unknown device {name!r}", where="--device", expected=here, got=name,
                         hint=f"devices here: {here}") from None
    if dev.type == "meta":
        raise UsageError(META_MESSAGE, where="--device", got=name, hint=META_HINT)
    try:
        torch.empty(0, device=dev)  # the one way to ask every backend "is it really there?"
    except Exception as exc:  # RuntimeError (mps, xla, bad ordinal), AssertionError (no CUDA build)
        what = "CUDA" if dev.type == "cuda" and not torch.cuda.is_available() else repr(str(dev))
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0].split(". ")[0][:100]
        raise UsageError(f"--device {name}, but {what} is not available here", where="--device",
                         expected=here, got=name, hint=f"torch says: {reason}; devices here: {here}") from None
    return dev


def available_devices() -> List[str]:
    """The devices this machine can run on: ``cpu``, then ``cuda:N``/``mps``/``xpu:N`` where present."""
    import torch

    names = ["cpu"]
    if torch.cuda.is_available():
        names += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        names.append("mps")
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        names += [f"xpu:{i}" for i in range(xpu.device_count())]
    return names


def refuse_meta(resolved) -> None:
    """A target built on the meta device (a spec's ``device: meta``) has no values to check: exit 2."""
    from layerlab.arguments import check_not_meta

    check_not_meta(resolved.module, resolved.values(), where=resolved.name)

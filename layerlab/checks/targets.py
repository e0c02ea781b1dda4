"""What ``layerlab gradcheck`` verifies: a :class:`~layerlab.target.Target` (registry layer, YAML spec),
or every registry layer.

:mod:`layerlab.target` builds the module, its inputs and its reference (the same way for every
command); :func:`verify_target` runs :func:`layerlab.checks.run.verify`'s machinery on them. A
registry layer is compared with the entry's torch.nn reference; a spec may add the keys in
:data:`~layerlab.target.build.SPEC_KEYS` (every command reads the same spec).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from layerlab.backends import DEFAULT_COMPILE_BACKEND
from layerlab.checks.report import CheckResult, MatrixReport, Status, VerifyReport
from layerlab.checks.run import VerifyOptions, verify_args
from layerlab.target.build import SPEC_KEYS, for_each_entry, from_entry, from_spec
from layerlab.target.core import Target
from layerlab.target.references import REFERENCE_OUTPUT

__all__ = ["verify_entry", "verify_spec", "verify_target", "verify_resolved", "verify_all", "SPEC_KEYS",
           "REFERENCE_OUTPUT"]


def verify_target(target: Target, *, deep: bool = False, only: Optional[Sequence[str]] = None,
                  slow_cap: int = 1_000_000, compile_backend: str = DEFAULT_COMPILE_BACKEND,
                  auto_reference: bool = True,
                  progress: Optional[Callable[[str, int, int], None]] = None) -> VerifyReport:
    """Verify a target (registry layer, spec, module + inputs) against its reference (without one,
    against the torch.nn layer it plainly mirrors, unless ``auto_reference`` is off)."""
    t = target
    opts = VerifyOptions(deep=deep, seed=t.seed, only=only, slow_cap=slow_cap, compile_backend=compile_backend,
                         auto_reference=auto_reference, progress=progress)  # progress(what, i, n): long checks
    return verify_args(t.module, t.args, t.reference, t.weight_map, t.tags, opts, t.name, dict(t.batch_dims),
                       t.reference_output)


verify_resolved = verify_target  # the name it had before Target


def verify_entry(name: str, *, deep: bool = False, seed: int = 0, only: Optional[Sequence[str]] = None,
                 slow_cap: int = 1_000_000, compile_backend: str = DEFAULT_COMPILE_BACKEND) -> VerifyReport:
    """Verify the registry layer ``name`` with its default arguments and inputs against its reference."""
    return verify_target(from_entry(name, seed=seed), deep=deep, only=only, slow_cap=slow_cap,
                           compile_backend=compile_backend)


def verify_spec(path: str, *, deep: bool = False, seed: Optional[int] = None, only: Optional[Sequence[str]] = None,
                slow_cap: int = 1_000_000, allow_import: bool = False,
                compile_backend: str = DEFAULT_COMPILE_BACKEND) -> VerifyReport:
    """Verify the layer a YAML spec builds; ``reference:`` names what it should equal.

    ``reference:`` is a layer name as ``layer:`` takes it (``nn.LSTM``, ``LSTM``, a registry name,
    an import path with ``allow_import``) built with the spec's ``args:``, or a mapping
    ``{layer: …, args: {…}, weight_map: {ours: theirs}, output: "flatten(2).transpose(1, 2)"}``.
    ``weight_map:`` may also stand at the top level; ``tags: [causal, …]`` (or ``causal: true``) states
    claims; ``batch_dims: {name: dim}`` fixes a batch-dim guess. Without ``reference:``, a registry
    layer (``layer: lstm``) is compared with its registry reference.
    """
    target = from_spec(path, seed=seed, allow_import=allow_import, strict=True)
    return verify_target(target, deep=deep, only=only, slow_cap=slow_cap, compile_backend=compile_backend)


def verify_all(names: Optional[Sequence[str]] = None, *, deep: bool = False, seed: int = 0,
               only: Optional[Sequence[str]] = None, slow_cap: int = 1_000_000,
               progress: Optional[Callable[[str, int, int], None]] = None,
               compile_backend: str = DEFAULT_COMPILE_BACKEND) -> MatrixReport:
    """Verify every registry layer (or ``names``); ``progress(name, i, n)`` is called before each."""
    reports, seconds = for_each_entry(
        names, lambda name: verify_entry(name, deep=deep, seed=seed, only=only, slow_cap=slow_cap,
                                         compile_backend=compile_backend),
        _unbuildable, progress)
    opts = VerifyOptions(deep=deep, only=only)
    return MatrixReport(reports=reports, check_names=opts.selected(), seconds=seconds)


def _unbuildable(name: str, exc: Exception) -> VerifyReport:
    from layerlab import registry

    entry = registry.find(name)
    text = str(exc).strip()
    message = getattr(exc, "message", None) or (text.splitlines()[0] if text else "")
    check = CheckResult("runs", Status.FAIL, f"the layer could not be built: {type(exc).__name__}: {message}",
                        where=getattr(exc, "where", None) or name, hint=getattr(exc, "hint", None),
                        details={"exception": type(exc).__name__, "message": str(exc)[:2000]})
    return VerifyReport(target=name, module=entry.target if entry else name,
                        reference=entry.reference if entry else None, checks=[check])

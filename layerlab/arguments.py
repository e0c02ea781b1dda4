"""Checks on the arguments every entry point shares: the module, the seed, tolerances, threads, meta tensors.

``layerlab.inspect``, ``verify``, ``profile`` and ``export_check`` (and the commands that call them)
run these first, so that bad input is a :class:`~layerlab.errors.UsageError` naming the argument,
never an ``AttributeError``, an ``Overflow`` from torch's seeding or a run that reports numbers for
tensors that have none. The CLI uses the same limits, so ``--seed`` and ``seed=`` agree.

torch is imported inside the functions that need it, never at module level.
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterable, Optional

from layerlab.errors import UsageError

#: The largest seed: torch's generators take a signed 64-bit seed (``manual_seed(2**64)`` raises
#: "Overflow when unpacking long long"); the non-negative half is the range every path accepts.
MAX_SEED = 2**63 - 1
#: The most intra-op threads a run may ask for, whatever the machine (see :func:`max_threads`).
THREADS_CEILING = 1024

#: What to say when a run would be on the meta device.
META_MESSAGE = ("meta tensors have shapes but no values, and this run computes with values "
                "(statistics, gradients, comparisons or timings)")
META_HINT = ("for shapes, dtypes and memory without values use `layerlab inspect --meta` "
             "(layerlab.inspect(..., meta=True)); otherwise build the model and its inputs on cpu or a real device")


def check_module(module: Any, api: str) -> None:
    """``module`` must be a ``torch.nn.Module`` (a plain function or a tensor is a usage error)."""
    import torch

    if not isinstance(module, torch.nn.Module):
        raise UsageError(f"{api} needs a torch.nn.Module", where="module", expected="nn.Module",
                         got=type(module).__name__,
                         hint="wrap a function in a small nn.Module, or pass the model itself")


def check_seed(seed: Any, where: str = "seed", *, optional: bool = False, bounded: bool = True) -> None:
    """An integer in ``0 … 2**63 − 1`` (``None`` too when ``optional``; any int when not ``bounded``:
    ``verify`` folds every seed into range itself, see :func:`layerlab.checks.case.seed_for`)."""
    if seed is None and optional:
        return
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise UsageError(f"{where} must be an integer", where=where, expected=f"an int in 0 … {MAX_SEED}",
                         got=type(seed).__name__)
    if bounded and not 0 <= seed <= MAX_SEED:
        raise UsageError(f"{where} must be between 0 and 2**63 − 1", where=where,
                         expected=f"0 … {MAX_SEED}", got=seed,
                         hint="torch's generators take a 64-bit seed; any smaller number will do")


def check_tolerance(value: Any, where: str) -> None:
    """A finite, non-negative number (``None`` is the default: allowed)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{where} must be a number", where=where, expected="a finite number ≥ 0",
                         got=type(value).__name__)
    if not math.isfinite(value):
        raise UsageError(f"{where} must be a finite number ≥ 0, got {value!r}", where=where,
                         expected="a finite number ≥ 0", got=value,
                         hint="a nan or infinite tolerance makes every comparison meaningless")
    if value < 0:
        raise UsageError(f"{where} must be ≥ 0, got {value!r}", where=where, expected="a finite number ≥ 0",
                         got=value, hint="a tolerance is a distance: 0 asks for equality")


def max_threads() -> int:
    """Four threads per CPU core this process may use, at most :data:`THREADS_CEILING`: more only
    adds scheduling noise to what is measured (and 100 000 threads can take the machine down)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    return min(4 * cores, THREADS_CEILING)


def check_threads(threads: Any, where: str = "threads") -> None:
    """``None`` (torch's setting) or an integer in ``1 … max_threads()``."""
    if threads is None:
        return
    if isinstance(threads, bool) or not isinstance(threads, int):
        raise UsageError(f"{where} must be an integer", where=where, got=type(threads).__name__)
    limit = max_threads()
    if not 1 <= threads <= limit:
        raise UsageError(f"{where} must be between 1 and {limit}, got {threads}", where=where,
                         expected=f"1 … {limit} (4 per CPU core here, at most {THREADS_CEILING})", got=threads,
                         hint="more threads than cores only adds scheduling noise to the times")


def is_meta_run(module: Any, values: Iterable[Any]) -> bool:
    """Would running ``module`` on ``values`` compute on the meta device?

    True when a parameter or buffer is on meta, or when the module has none on a real device and an
    input is on meta. A real model fed a meta input is not a meta run: that is a device mismatch the
    model's own forward reports (and ``inspect`` diagnoses).
    """
    import torch

    tensors = [t for t in (*module.parameters(), *module.buffers()) if not torch.nn.parameter.is_lazy(t)]
    if any(t.is_meta for t in tensors):
        return True
    if tensors:
        return False
    return any(t.is_meta for t in _tensors(values))


def check_not_meta(module: Any, values: Iterable[Any], where: Optional[str] = None) -> None:
    """Refuse a run on the meta device (:func:`is_meta_run`) with a clear message."""
    if is_meta_run(module, values):
        raise UsageError(META_MESSAGE, where=where or "device", got="meta", hint=META_HINT)


def _tensors(values: Iterable[Any]):
    import torch

    stack = list(values)
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())

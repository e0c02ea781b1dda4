"""Every public entry point's envelope: leave no trace, and the run guard (exit, interrupt, timeout).

    @entry_point("profile")
    def profile(module, *inputs, ...): ...

wraps the function so that, whatever it does and however it ends:

* the model passed first, the tensors among the other arguments, and the process state are put
  back as they were (:func:`layerlab.target.no_trace.leave_no_trace`);
* ``sys.exit`` / ``KeyboardInterrupt`` from the model's code and a ``timeout=`` (seconds, keyword
  only, default none) end the call with a :class:`~layerlab.errors.CheckFailed`
  (:func:`layerlab.faults.run_guard`).

An entry point called from inside another one (``verify`` re-running ``inspect``) adds no second
snapshot: the outer one restores everything at the end.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Optional

__all__ = ["entry_point", "time_limit"]

_depth = threading.local()


def entry_point(command: str, *, timeout_kwarg: bool = True, pure: bool = False,
                run_limit: Optional[Callable[[dict], float]] = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The decorator (see the module docstring). ``timeout_kwarg=False``: the function has its own
    ``timeout`` parameter with another meaning (ddp-check's collective timeout), left to it; then
    ``run_limit(kwargs)`` gives the whole run's wall-clock limit (a forward that never returns in the
    driver's own single-process step must not hang the command).
    ``pure``: the function runs no model and changes no state (``diff``): the guard only, no snapshot
    (and no torch import)."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            timeout = kwargs.pop("timeout", None) if timeout_kwarg else None
            if run_limit is not None and timeout is None:
                timeout = run_limit(kwargs)
            if getattr(_depth, "n", 0):
                return fn(*args, **kwargs)
            from layerlab.faults import run_guard, step, watch_model

            if pure:
                with run_guard(command, timeout):
                    return fn(*args, **kwargs)
            import torch

            from layerlab.target.no_trace import leave_no_trace

            module = args[0] if args and isinstance(args[0], torch.nn.Module) else None
            values = [*args[1:], *kwargs.values()]
            _depth.n = 1
            try:
                with leave_no_trace(module, values):
                    with run_guard(command, timeout):  # inside: the deadline never interrupts the restore
                        watch_model(module)
                        step(None)  # the command names its steps from here on
                        return fn(*args, **kwargs)
            finally:
                _depth.n = 0

        return run

    return wrap


def time_limit(seconds: Optional[float], command: str = "the run"):
    """``with layerlab.time_limit(30): ...``: the same deadline for any code (several calls at once)."""
    from layerlab.faults import run_guard

    return run_guard(command, seconds)

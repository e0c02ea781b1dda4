"""Run a meta-device forward without importing ``torch._dynamo`` (about 1 s of every command).

torch's meta kernels for many ops (``addmm``, ``mm``, elementwise ops, ``native_batch_norm``) are
Python references wrapped in ``torch._disable_dynamo``. That wrapper's first call imports
``torch._dynamo`` (0.9–1.2 s on this project's machines, as much as ``import torch`` itself) only to
mark the reference as "never trace into this under ``torch.compile``", and caches the marked
function on the reference as ``__dynamo_disable``.

A spec's memory estimate (:mod:`layerlab.spec.memory`) runs the model once on meta tensors, before
any command starts, and never under ``torch.compile``. :func:`no_dynamo_import` lets it do so with
a stand-in module in ``sys.modules`` whose ``disable(fn)`` returns ``fn`` unchanged — exactly what
calling the disabled function does outside compilation — and notes every function it was handed.
On the way out it removes the stand-in and the cached ``__dynamo_disable`` attributes it caused, so
the first real use of ``torch._dynamo`` later in the process imports and marks them as torch
intends.

It stands aside (the ordinary import happens) when ``torch._dynamo`` is already imported, or when
another Python thread is running (a stand-in visible to it could break its own use of dynamo).
Code that asks the stand-in for anything but ``disable`` — or keeps a reference to it and calls
``disable`` after the window — gets the real module, imported at that moment: a module first
imported during the window that binds ``torch._dynamo`` keeps working.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import types
from typing import Any, Callable, Iterator, List

_NAME = "torch._dynamo"


class _StandIn(types.ModuleType):
    """``torch._dynamo`` while a meta forward runs: ``disable(fn)`` is ``fn``; anything else, or
    ``disable`` once the window has closed (code that kept a reference to this module), is the real
    module's — imported then, and from then on in ``sys.modules`` instead of this."""

    def __init__(self) -> None:
        super().__init__(_NAME, "layerlab's stand-in for a meta forward (see layerlab.spec.dynamo_stub)")
        self.open = True
        self.handed: List[Callable] = []

    def disable(self, fn: Callable, *args: Any, **kwargs: Any) -> Callable:
        if self.open:
            self.handed.append(fn)
            return fn
        return _real(self).disable(fn, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # pickling, copy, introspection: not dynamo's business
            raise AttributeError(name)
        return getattr(_real(self), name)


def _real(stand_in: _StandIn) -> types.ModuleType:
    """The real ``torch._dynamo``: the stand-in closes for good (its marks are removed on the way
    out of :func:`no_dynamo_import`) and the import happens as it would have."""
    import importlib

    stand_in.open = False
    if sys.modules.get(_NAME) is stand_in:
        del sys.modules[_NAME]
    return importlib.import_module(_NAME)


@contextlib.contextmanager
def no_dynamo_import() -> Iterator[bool]:
    """Within: ``torch._disable_dynamo`` wrappers call their function without importing dynamo.

    Yields whether the stand-in is in place (``False``: it stood aside, see the module docstring)."""
    import torch

    if _NAME in sys.modules or threading.active_count() > 1:
        yield False
        return
    stub = _StandIn()
    sys.modules[_NAME] = stub
    had_attr = "_dynamo" in vars(torch)
    try:
        yield True
    finally:
        stub.open = False
        if sys.modules.get(_NAME) is stub:
            del sys.modules[_NAME]
        if not had_attr and vars(torch).get("_dynamo") is stub:
            delattr(torch, "_dynamo")
        for fn in stub.handed:
            if getattr(fn, "__dynamo_disable", None) is fn:
                try:
                    delattr(fn, "__dynamo_disable")
                except (AttributeError, TypeError):  # pragma: no cover - a builtin that took no attribute
                    pass

"""The thing under test, one concept for every command: a module, its inputs bound to ``forward``,
its reference, its claims and its batch dims.

    >>> from layerlab.target import resolve
    >>> t = resolve("configs/conv2d.yaml")            # or a registry name: resolve("conv2d")
    >>> pos, kw = t.split(); out = t.module(*pos, **kw)

* :mod:`layerlab.target.core`: :class:`Target`, :func:`from_module` (Python), :func:`to_device`.
* :mod:`layerlab.target.build`: a spec file or a registry name → Target (:func:`resolve`).
* :mod:`layerlab.target.bind`: :class:`Arg`, binding inputs to ``forward``, walking nested tensors.
* :mod:`layerlab.target.references`: the reference a Target should equal.
* :mod:`layerlab.target.discover`: what there is to run (``layerlab list``) and did-you-mean hints.
* :mod:`layerlab.target.entry`: every public entry point's envelope — :mod:`~layerlab.target.no_trace`
  (the model, inputs and process state put back as they were) and :mod:`~layerlab.faults`
  (the model's ``sys.exit`` / ``KeyboardInterrupt``, ``timeout=``); :mod:`~layerlab.target.fresh_inputs`
  (a forward that writes into its input), :mod:`~layerlab.target.buffers`,
  :mod:`~layerlab.target.copying`, :mod:`~layerlab.target.seeding`.

Dependencies: target → (layers, spec, shapes) → errors; every command's package imports it, never
the other way. Importing the package imports nothing heavy: its names load on first use, and only
:mod:`~layerlab.target.bind` and :mod:`~layerlab.target.core` import ``torch`` at module level.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Arg", "Target", "bind", "from_module", "resolve", "to_device"]

_HOMES = {"Arg": "bind", "bind": "bind", "Target": "core", "from_module": "core", "to_device": "core",
          "resolve": "build"}


def __getattr__(name: str) -> Any:
    """Lazy exports: importing the package (``layerlab list``, hints) does not import torch."""
    if name not in _HOMES:
        raise AttributeError(f"module 'layerlab.target' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"layerlab.target.{_HOMES[name]}"), name)

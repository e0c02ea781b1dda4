"""``torch.compile`` backends: the one default every command uses, and checking a name.

The default is ``aot_eager`` for gradcheck ``--deep``, export-check and ``profile --compile`` alike
(they used to differ: aot_eager in one, inductor in two). Why aot_eager:

* It is what these checks are about: TorchDynamo captures the whole graph (``fullgraph``) and
  AOTAutograd traces forward and backward: graph breaks, data-dependent branches and unsupported
  ops show up there.
* It needs no C++ compiler. inductor on CPU generates and builds C++; on a machine without a
  working toolchain every layer, stock ``torch.nn`` ones included, would "fail to compile": a
  false alarm about the user's layer.
* It takes seconds; inductor tens of seconds per layer on CPU (``--all`` would take minutes).

What it does not see is inductor's own code generation and numerics, and ``profile --compile``
with it times capture overhead rather than inductor's speed-up: pass ``--compile-backend
inductor`` for those. Every report names the backend it used.
"""

from __future__ import annotations

import difflib

from layerlab.errors import UsageError

__all__ = ["DEFAULT_COMPILE_BACKEND", "check_backend"]

DEFAULT_COMPILE_BACKEND = "aot_eager"

#: names torch always has: checked without importing torch._dynamo (slow to import)
_BUILTIN = ("aot_eager", "inductor", "eager")


def check_backend(name: str, flag: str = "--compile-backend") -> None:
    """A usage error (exit 2, did-you-mean) when torch has no ``torch.compile`` backend ``name``."""
    if name in _BUILTIN:
        return
    import torch._dynamo

    known = torch._dynamo.list_backends(exclude_tags=())
    if name not in known:
        close = difflib.get_close_matches(name, [*known, *_BUILTIN], n=1)
        raise UsageError(f"no torch.compile backend called {name!r}", where=flag,
                         expected=", ".join(sorted({*known, *_BUILTIN})), got=name,
                         hint=f"did you mean {close[0]!r}?" if close else None)

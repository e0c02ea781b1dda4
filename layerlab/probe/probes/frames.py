"""Which module of the model is running right now, read off the Python stack.

A ``TorchFunctionMode`` sees a call (``F.scaled_dot_product_attention``, ``F.relu``) but not the
module whose code made it. Rather than a hook on every module (a cost on every call of every
module), the probe that needs to know walks the stack when it sees a call it cares about: the
innermost ``forward`` frame whose ``self`` is a module of the model names it.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Optional, Tuple

__all__ = ["innermost_module", "CallCounter"]

#: frames looked at before giving up (deep stacks of helpers between forward and the op are rare)
_MAX_FRAMES = 64


def innermost_module(path_of: Dict[int, str]) -> Tuple[Optional[Any], str]:
    """``(module, path)`` of the innermost module of the model whose code is running (``(None, "")``
    outside any: the op came from code outside the model's forward)."""
    frame = sys._getframe(1)
    for _ in range(_MAX_FRAMES):
        if frame is None:
            break
        code = frame.f_code
        if code.co_argcount and code.co_varnames[0] == "self":
            owner = frame.f_locals.get("self")
            path = path_of.get(id(owner))
            if path is not None:
                return owner, path
        frame = frame.f_back
    return None, ""


class CallCounter:
    """Numbers what a probe sees per module: the n-th attention computation (or activation call)
    inside the module at a path, 1-based."""

    def __init__(self) -> None:
        self._n: Dict[str, int] = {}

    def next(self, path: str) -> int:
        n = self._n.get(path, 0) + 1
        self._n[path] = n
        return n

"""Low-precision islands: ops that compute in float32 (or lower) inside a float64 check.

The numerical gradient checks run a float64 copy of the layer, because float32 cannot resolve a
1e-6 finite-difference step. Many stock layers still compute part of their forward in float32
on purpose: Hugging Face's ``LlamaRMSNorm`` and ``T5LayerNorm`` call ``.to(torch.float32)``
before the variance; rotary embeddings compute ``cos``/``sin`` in float32. Inside such an
island a float64 input is rounded to ~7 significant digits, so a 1e-6 step is lost in rounding
and the central difference is noise — a correct backward then looks wrong.

:class:`IslandRecorder` is a :class:`torch.overrides.TorchFunctionMode` (torch's own hook, no
function patched) around one forward. It notes each op whose floating output is below float64
*and requires grad* — i.e. the differentiable data passed through low precision. Constants
computed in float32 (RoPE's ``cos``/``sin`` of integer positions) do not require grad and are
not islands: rounding a constant does not disturb a finite difference. Only metadata is kept:
the op's name, the output dtype and the user's ``file:line`` (the first frame outside torch and
layerlab), grouped with a count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode

from layerlab.probe.ops import _display_path, _user_frame, op_name

#: dtypes whose rounding swamps a float64 finite difference
LOW = (torch.float32, torch.float16, torch.bfloat16)
#: distinct (source, op, dtype) kept; more are counted in :attr:`IslandRecorder.more`
MAX_KEPT = 12


@dataclass
class Island:
    """Ops at one source line that produced a low-precision differentiable output."""

    op: str
    dtype: str
    source: Optional[str]
    count: int = 1

    def to_dict(self) -> Dict[str, Any]:
        return {"op": self.op, "dtype": self.dtype, "source": self.source, "count": self.count}

    def describe(self) -> str:
        where = f" at {self.source}" if self.source else ""
        times = f" ×{self.count}" if self.count > 1 else ""
        return f"{self.op} → {self.dtype}{where}{times}"


class IslandRecorder(TorchFunctionMode):
    """Record the ops of a forward whose differentiable outputs are float32 or lower."""

    def __init__(self) -> None:
        super().__init__()
        self._found: Dict[Tuple[Optional[str], str, str], Island] = {}
        self.more = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        low = _low_dtype(out)
        if low is not None:
            self._note(op_name(func), low)
        return out

    def _note(self, name: str, dtype: torch.dtype) -> None:
        frame = _user_frame()
        source = f"{_display_path(frame.f_code.co_filename)}:{frame.f_lineno}" if frame is not None else None
        key = (source, name, str(dtype).replace("torch.", ""))
        found = self._found.get(key)
        if found is not None:
            found.count += 1
        elif len(self._found) < MAX_KEPT:
            self._found[key] = Island(op=name, dtype=key[2], source=source)
        else:
            self.more += 1

    @property
    def islands(self) -> List[Island]:
        return list(self._found.values())

    @property
    def lowest(self) -> Optional[torch.dtype]:
        """The least precise dtype seen (``None``: the forward stayed in float64)."""
        dtypes = {getattr(torch, i.dtype) for i in self._found.values()}
        return max(dtypes, key=lambda d: torch.finfo(d).eps) if dtypes else None


def _low_dtype(out: Any) -> Optional[torch.dtype]:
    if isinstance(out, torch.Tensor):
        return out.dtype if out.dtype in LOW and out.requires_grad else None
    if isinstance(out, (tuple, list)) and len(out) <= 64:
        for o in out:
            if isinstance(o, torch.Tensor) and o.dtype in LOW and o.requires_grad:
                return o.dtype
    return None


def summary(islands: List[Island], more: int = 0, limit: int = 3) -> str:
    """``"to → float32 at modeling_llama.py:71 ×2, pow → float32 at …"`` (the first ``limit``)."""
    shown = ", ".join(i.describe() for i in islands[:limit])
    rest = len(islands) - limit + more
    return shown + (f" and {rest} more" if rest > 0 else "")

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
not islands: rounding a constant does not disturb a finite difference. Parity checks compare
values, not differences, so for them every low-precision floating output counts
(``IslandRecorder(differentiable_only=False)``): a float32 constant rounds the output as much as a
float32 activation, and :func:`parity_tolerances` widens the comparison to that precision. Only metadata is kept:
the op's name, the output dtype and the user's ``file:line`` (the first frame outside torch and
layerlab), grouped with a count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode

from layerlab.checks.compare import tolerances
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

    def __init__(self, differentiable_only: bool = True) -> None:
        super().__init__()
        self.differentiable_only = differentiable_only
        self._found: Dict[Tuple[Optional[str], str, str], Island] = {}
        self.more = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        low = _low_dtype(out, self.differentiable_only)
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


def _low_dtype(out: Any, differentiable_only: bool = True) -> Optional[torch.dtype]:
    def low(t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.dtype in LOW and (t.requires_grad or not differentiable_only)

    if low(out):
        return out.dtype
    if isinstance(out, (tuple, list)) and len(out) <= 64:
        for o in out:
            if low(o):
                return o.dtype
    return None


def parity_tolerances(lowest: Optional[torch.dtype]) -> Optional[Tuple[float, float]]:
    """``(rtol, atol)`` for a float64 parity comparison whose forward rounded through ``lowest``:
    ``assert_close``'s tolerances for that dtype (``None``: no island, keep float64's). A module that
    computes in float32 on purpose (Llama's RMSNorm) differs from a float64 reference by float32
    rounding, ~1e-7 relative, which float64's 1e-7 + 1e-7·|x| would call a mismatch."""
    if lowest is None:
        return None
    return tolerances(lowest)


def summary(islands: List[Island], more: int = 0, limit: int = 3) -> str:
    """``"to → float32 at modeling_llama.py:71 ×2, pow → float32 at …"`` (the first ``limit``)."""
    shown = ", ".join(i.describe() for i in islands[:limit])
    rest = len(islands) - limit + more
    return shown + (f" and {rest} more" if rest > 0 else "")


class Islands:
    """Low-precision ops seen in the float64 runs of ours and the reference, and what they imply
    for the tolerance (``tol`` ``None``: none seen, float64's tolerances hold)."""

    def __init__(self) -> None:
        self.lowest: Optional[torch.dtype] = None
        self.seen: Dict[str, str] = {}  # who → the ops

    def record(self, who: str, run: Any, dtype: torch.dtype) -> Any:
        if dtype != torch.float64:
            return run()
        with IslandRecorder(differentiable_only=False) as recorder:
            out = run()
        if recorder.lowest is not None:
            self.seen[who] = summary(recorder.islands, recorder.more)
            if self.lowest is None or torch.finfo(recorder.lowest).eps > torch.finfo(self.lowest).eps:
                self.lowest = recorder.lowest
        return out

    @property
    def tol(self) -> Optional[Tuple[float, float]]:
        return parity_tolerances(self.lowest)

    def note(self) -> str:
        """Why the tolerance is wider (empty when it is not)."""
        if self.lowest is None:
            return ""
        rtol, atol = self.tol
        ops = "; ".join(f"{who}: {ops}" for who, ops in self.seen.items())
        return (f"compared at {_short(self.lowest)} tolerances (rtol {rtol:g}, atol {atol:g}) because "
                f"{' and '.join(self.seen)} compute{'s' if len(self.seen) == 1 else ''} in "
                f"{_short(self.lowest)} inside the float64 run ({ops})")

    def to_dict(self) -> Dict[str, Any]:
        rtol, atol = self.tol
        return {"dtype": _short(self.lowest), "rtol": rtol, "atol": atol, "ops": dict(self.seen)}


def _short(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")

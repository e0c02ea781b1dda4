"""The no-input view of explain-shape: the general formula and a table of common input sizes.

For ``layerlab explain-shape --kernel 3 --stride 2`` there is no input to explain, so we show
what the op does to the sizes people use (7 … 256), which of them lose no pixels, and — for
conv and pool — the padding that keeps the size at stride 1 (shape_rules.md §14.1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from layerlab.shapes import explain
from layerlab.shapes.unread import unread_count
from layerlab.shapes.ops import resolve

COMMON_SIZES = (7, 8, 14, 15, 16, 28, 31, 32, 33, 56, 64, 100, 112, 128, 224, 225, 256)


@dataclass
class SizeRow:
    """One input size: the output (``None`` if torch raises), pixels lost, or the error."""

    input: int
    output: Optional[int]
    lost_pixels: int = 0
    error: Optional[str] = None


@dataclass
class SizeTable:
    op: str
    call: str
    formula: str
    keep_size: Optional[str]
    rows: List[SizeRow] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return any(r.output is not None for r in self.rows)

    def to_dict(self) -> dict:
        from layerlab.shapes.result import SCHEMA_VERSION

        return {"schema": SCHEMA_VERSION, "kind": "size-table", "op": self.op, "call": self.call,
                "formula": self.formula, "keep_size": self.keep_size, "ok": self.ok, "rows": self.rows}


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, (tuple, list)) and value else value


def _lost(family: str, L: int, out: int, params: Dict[str, Any]) -> int:
    """Real pixels no window reads (conv and pools; other ops never crop)."""
    if family not in ("conv", "pool", "fold"):
        return 0
    k = _first(params.get("kernel_size"))
    s = _first(params.get("stride")) or k
    p = _first(params.get("padding", 0))
    d = _first(params.get("dilation", 1))
    if p == "valid":
        p = 0
    if isinstance(p, str) or not isinstance(k, int):
        return 0  # 'same' pads to keep every pixel in play
    return unread_count(L, k, s, p, d, out) or 0


def _keep_size(family: str, params: Dict[str, Any]) -> Optional[str]:
    k, d = _first(params.get("kernel_size")), _first(params.get("dilation", 1)) or 1
    if family not in ("conv", "pool") or not isinstance(k, int):
        return None
    total = d * (k - 1)
    if family == "pool" and d != 1:
        return f"none: a dilated pool needs p = {total}/2 but pools allow p ≤ k//2 = {k // 2}"
    if total % 2 == 0:
        return f"stride=1, padding={total // 2}  (p = d·(k−1)/2 = {d}·({k}−1)/2)"
    if family == "conv":
        return f"no symmetric int padding (d·(k−1) = {total} is odd): use padding='same' (left {total // 2}, right {total - total // 2})"
    return f"none: an even kernel (k={k}) cannot keep the size"


def size_table(op: str, nd: int, sizes: Sequence[int] = COMMON_SIZES, channels: int = 1,
               torch_version: Optional[str] = None, **params: Any) -> SizeTable:
    """Apply ``op(**params)`` to square inputs of each size in ``sizes`` (batch 1), as
    ``torch_version`` would (default: the installed torch)."""
    spec = resolve(op, n_spatial=nd)
    nd = spec.nd or nd
    table: Optional[SizeTable] = None
    for L in sizes:
        ex = explain(spec.key, (1, channels) + (L,) * nd, torch_version=torch_version, **params)
        if table is None:
            formula = ex.steps[0].formula if ex.steps else ""
            table = SizeTable(spec.name, ex.call, formula, _keep_size(spec.family, ex.params))
        if ex.output_shape is None:
            msg = ex.error.torch_message if ex.error is not None else "error"
            table.rows.append(SizeRow(L, None, error=msg))
            continue
        out = ex.output_shape[-1]
        table.rows.append(SizeRow(L, out, _lost(spec.family, L, out, ex.params)))
    if table is None:  # no sizes given
        table = SizeTable(spec.name, spec.name, "", None)
    return table

"""The memory table of ``layerlab inspect --meta``: estimated bytes per module call, and totals.

The numbers come from :class:`layerlab.probe.meta.MetaMemory` (numel × element size of each call's
outputs, their gradients and the parameters); this module only lays them out.
"""

from __future__ import annotations

from typing import Optional

from rich.table import Table
from rich.text import Text

from layerlab.text_safety import displays


def human_bytes(n: int) -> str:
    """``1536`` → ``1.5 KiB`` (binary units, three significant digits; ``0`` → ``—``)."""
    if not n:
        return "—"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover - the loop always returns


@displays
def memory_table(report, depth: Optional[int] = None) -> Table:
    """Rows per module call (those deeper than ``depth`` left out) and a closing total row."""
    memory = report.memory
    table = Table(title="Memory estimate  (meta run: numel × element size; no values, no statistics)",
                  title_justify="left", box=None, header_style="bold", show_edge=False)
    for name, justify in (("#", "right"), ("module", "left"), ("output", "left"), ("activations", "right"),
                          ("gradients", "right"), ("params", "right")):
        table.add_column(name, justify=justify, no_wrap=name != "module")
    calls = {c.index: c for c in report.calls}
    for row in memory.layers:
        call = calls.get(row.call)
        if call is None or (depth is not None and call.depth > depth):
            continue
        name = "  " * call.depth + (call.path.rpartition(".")[2] + " " if call.path else "") + call.class_name
        shapes = ", ".join("(" + ", ".join("?" if s is None else str(s) for s in o.shape) + ")"
                           for o in call.tensor_outputs[:2])
        table.add_row(str(row.call), name, shapes, human_bytes(row.activation_bytes),
                      human_bytes(row.grad_bytes), human_bytes(row.param_bytes))
    table.add_section()
    table.add_row("", Text("total (each tensor once)", style="bold"), "", human_bytes(memory.activation_bytes),
                  human_bytes(memory.grad_bytes), human_bytes(memory.param_bytes))
    table.add_row("", "parameter gradients", "", "", human_bytes(memory.param_grad_bytes), "")
    if memory.buffer_bytes:
        table.add_row("", "buffers", "", "", "", human_bytes(memory.buffer_bytes))
    return table

"""The Parameters table of ``layerlab inspect``, folded like the call tables at ``--depth N``.

Without ``--depth`` every parameter has its row. With it, a parameter of a module deeper than N
joins the row of its ancestor at depth N (a numbered block under a container counts as that
level: ``encoder.layer.3``), and runs of identical blocks fold into one row
(``encoder.layer.0–11 ×12``). A grouped row's ``‖w‖`` and ``‖grad‖`` are the L2 norms of all
its tensors together (√Σ‖·‖², exact); the flags column shows each block's ``‖grad‖`` as a
sparkline. A parameter with a warning flag (``no-grad``, ``nan`` …) is never grouped: it keeps
its own row wherever it sits.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from rich.console import Group
from rich.text import Text

from layerlab.cli.render_common import fit_columns, shape
from layerlab.cli.render_fold import numbered_run_label, sparkline
from layerlab.cli.render_inspect_forward import num, table, titled
from layerlab.probe.report import InspectReport, ParamRecord

_FLAG_STYLE = {"no-grad": "red", "nan": "red", "inf": "red", "zero-grad": "yellow",
               "vanishing": "yellow", "exploding": "yellow"}
_NAME_MIN = 16  # a parameter name cut below this says nothing


@dataclass
class _Group:
    """The parameters of one block (``encoder.layer.3``), or of a run of identical blocks."""

    path: str  # the first block's
    blocks: List[List[ParamRecord]] = field(default_factory=list)
    last: str = ""  # the last block's path when blocks were folded

    @property
    def params(self) -> List[ParamRecord]:
        return [p for b in self.blocks for p in b]


def _warned(p: ParamRecord) -> bool:
    return bool(p.flags) and p.trainable and not p.expected


def _key(p: ParamRecord, depth: int) -> Optional[str]:
    """The group a parameter joins at ``depth`` (``None``: it keeps its own row)."""
    parts = p.module.split(".") if p.module else []
    if len(parts) <= depth or _warned(p):
        return None
    n = depth + 1 if parts[depth].isdigit() else depth  # a numbered block, not its bare container
    return ".".join(parts[:max(n, 1)])


def _structure(group: _Group, block: List[ParamRecord]) -> Tuple:
    prefix = len(group.path) + 1
    return tuple((p.name[prefix:], tuple(p.shape), p.trainable, p.dtype) for p in block)


def _entries(report: InspectReport, depth: Optional[int]) -> List[object]:
    """ParamRecords and _Groups, in order of first appearance, runs of identical blocks folded."""
    if depth is None:
        return list(report.params)
    out: List[object] = []
    groups: Dict[str, _Group] = {}
    for p in report.params:
        key = _key(p, depth)
        if key is None:
            out.append(p)
        elif key in groups:
            groups[key].blocks[0].append(p)
        else:
            groups[key] = _Group(key, [[p]])
            out.append(groups[key])
    folded: List[object] = []
    for e in out:
        prev = folded[-1] if folded else None
        if (isinstance(e, _Group) and isinstance(prev, _Group) and _siblings(prev, e)
                and _structure(prev, prev.blocks[0]) == _structure(e, e.blocks[0])):
            prev.blocks.append(e.blocks[0])
            prev.last = e.path
            continue
        folded.append(e)
    return folded


def _siblings(run: _Group, nxt: _Group) -> bool:
    head, _, a = (run.last or run.path).rpartition(".")
    head2, _, b = nxt.path.rpartition(".")
    return head == head2 and a.isdigit() and b.isdigit() and int(b) == int(a) + 1


def _norm(values: List[Optional[float]]) -> Optional[float]:
    if not values or any(v is None for v in values):
        return None
    return math.sqrt(sum(v * v for v in values))


def _group_cells(g: _Group, backward: bool) -> List[str]:
    params = g.params
    trainable = [p for p in params if p.trainable]
    w = _norm([p.norm for p in params])
    grad = _norm([p.grad_norm for p in trainable]) if backward and trainable else None
    ratio = grad / w if grad is not None and w else None
    per_block = "tensors each" if len(g.blocks) > 1 else "tensors"
    flags = []
    if len(g.blocks) > 1 and backward:
        flags.append(f"{sparkline([_norm([p.grad_norm for p in b if p.trainable]) for b in g.blocks])}")
    expected = Counter(f for p in trainable if p.expected for f in p.flags)
    flags += [f"[dim]{f} ×{n} (expected)[/]" for f, n in expected.items()]
    frozen = len(params) - len(trainable)
    if frozen:
        flags.append(f"[dim]{frozen} frozen[/]")
    return [f"{len(g.blocks[0])} {per_block}", num(w), num(grad) if grad is not None else "—", num(ratio),
            " ".join(flags)]


def _param_cells(p: ParamRecord, backward: bool) -> List[str]:
    flags = " ".join(f"[{_FLAG_STYLE.get(f, 'yellow')}]{f}[/]" for f in p.flags)
    if p.expected:  # small or zero by construction: see the notes
        flags = "[dim]" + " ".join(p.flags) + " (expected)[/]"
    if not p.trainable:
        flags = "[dim]frozen[/]"
    return [shape(p.shape), num(p.norm), num(p.grad_norm) if backward and p.trainable else "—", num(p.ratio), flags]


def _name(e: object, width: Optional[int]) -> Text:
    if isinstance(e, _Group):
        label = numbered_run_label([e.path, e.last]) if len(e.blocks) > 1 else e.path
        suffix = f" ×{len(e.blocks)}" if len(e.blocks) > 1 else ""
    else:
        label, suffix = e.name, ""
    if width is not None and len(label) + len(suffix) > width:
        keep = max(width - len(suffix) - 1, 1)
        label = "…" + label[len(label) - keep:]
    text = Text(label)
    if suffix:
        text.append(suffix, style="bold")
    return text


def param_table(report: InspectReport, depth: Optional[int] = None, width: Optional[int] = None) -> Optional[Group]:
    """Every parameter (``depth``: grouped per block at that depth, identical blocks folded) with
    its norm, its gradient's norm and their ratio, laid out for ``width`` cells (names cut from
    the left, never a number)."""
    if not report.params:
        return None
    backward = report.backward.ran
    entries = _entries(report, depth)
    body = [(e, _group_cells(e, backward) if isinstance(e, _Group) else _param_cells(e, backward)) for e in entries]
    titles = ["parameter", "shape", "‖w‖", "‖grad‖", "‖grad‖/‖w‖", ""]
    need = {"parameter": max([len("parameter")] + [_name(e, None).cell_len for e, _ in body])}
    for k, t in enumerate(titles[1:]):
        need[t] = max([len(t)] + [Text.from_markup(cells[k]).cell_len for _, cells in body])
    if not any(cells[-1] for _, cells in body):
        del need[""]
    soft = {"": min(need.get("", 0), 24), "parameter": min(need["parameter"], 28)}
    hard = {"": min(need.get("", 0), 12), "parameter": min(need["parameter"], _NAME_MIN)}
    widths, pad = fit_columns(need, width, soft=soft, hard=hard)
    grouped = any(isinstance(e, _Group) for e in entries)
    t = table("", pad=pad)
    for name in widths:
        if name == "parameter":
            t.add_column(name, no_wrap=True, max_width=widths[name])
        elif name == "":
            t.add_column(name, overflow="fold")
        else:
            t.add_column(name, justify="left" if name == "shape" else "right", no_wrap=True, min_width=widths[name])
    for e, cells in body:
        named = dict(zip(titles[1:], cells))
        named["parameter"] = _name(e, widths["parameter"])
        t.add_row(*(named[n] for n in widths))
    legend = "a row per block below --depth: norms of all its tensors together, ▁▃▆ ‖grad‖ per block" if grouped else ""
    return titled("Parameters", legend, t)

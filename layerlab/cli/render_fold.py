"""Rows of the inspect tables at real scale: containers as their own level, identical blocks folded.

A 12-block transformer has 200+ module calls. Two things make its tables readable:

* **Containers.** ``nn.ModuleList``/``ModuleDict`` are never called, so no call record exists for
  ``h`` in GPT-2 and ``h.0`` (depth 2) would print right under ``drop Dropout`` (depth 1) as if it
  were nested in it. A :class:`Row` for the uncalled container keeps the levels honest.
* **Folds.** A run of sibling blocks (``h.0``, ``h.1`` … numbered children of one container, same
  class, one call each, each fed by the previous one's output) whose insides are hidden by
  ``--depth`` is one row ``h.0–11 GPT2Block ×12``. It stands for the stack as one module: the
  first block's input, the last block's output, and per-block figures as a sparkline. A block
  that raised, or whose values or gradients hold NaN/Inf, is never folded away.

Only formatting decisions here; the report is not changed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from layerlab.probe.report import CallRecord, InspectReport

#: Fewest blocks worth a fold where the container's level is shown anyway (2 would save nothing).
MIN_RUN = 3
BARS = "▁▂▃▄▅▆▇█"


@dataclass
class Row:
    """One row of the forward/backward tables: a call, an uncalled container, or a fold of blocks.

    ``call`` is the call whose figures are shown (a fold's last block; ``None`` for a container);
    ``blocks`` every block of a fold, in order; ``path`` the name shown.
    """

    path: str
    depth: int
    call: Optional[CallRecord] = None
    blocks: List[CallRecord] = field(default_factory=list)
    children: List[CallRecord] = field(default_factory=list)  # a container's direct child calls
    caption: str = ""  # a line of its own under a fold (its per-block sparkline), no figures
    fold: Optional["Row"] = None  # the fold a caption belongs to

    @property
    def is_fold(self) -> bool:
        return bool(self.blocks)

    @property
    def is_container(self) -> bool:
        return self.call is None

    @property
    def first(self) -> Optional[CallRecord]:
        return self.blocks[0] if self.blocks else self.call


def sparkline(values: Sequence[Optional[float]], cap: int = 12) -> str:
    """``▁▃▅█`` scaled from 0 to the largest value, so that near-equal values look equal (a
    min-to-max scale would blow 29.7 vs 31.5 up into a cliff). More than ``cap`` values are
    bucketed, each bar the bucket's largest; a missing or non-finite value is ``·``."""
    vals = list(values)
    if len(vals) > cap:
        size = math.ceil(len(vals) / cap)
        vals = [_max_or_none(vals[i:i + size]) for i in range(0, len(vals), size)]
    finite = [v for v in vals if v is not None and math.isfinite(v)]
    top = max((abs(v) for v in finite), default=0.0)
    out = []
    for v in vals:
        if v is None or not math.isfinite(v):
            out.append("·")
        elif top == 0:
            out.append(BARS[0])
        else:
            out.append(BARS[min(len(BARS) - 1, int(abs(v) / top * (len(BARS) - 1) + 0.5))])
    return "".join(out)


def _max_or_none(chunk: list) -> Optional[float]:
    finite = [v for v in chunk if v is not None and math.isfinite(v)]
    return max(finite) if len(finite) == len(chunk) else None


def numbered_run_label(paths: Sequence[str]) -> str:
    """``h.0–11`` for ``h.0`` … ``h.11``."""
    head, _, first = paths[0].rpartition(".")
    last = paths[-1].rpartition(".")[2]
    return f"{head}.{first}–{last}" if head else f"{first}–{last}"


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def _numbered(path: str) -> bool:
    return path.rpartition(".")[2].isdigit()


def _shapes(call: CallRecord) -> tuple:
    return (tuple(tuple(i.shape) for i in call.tensor_inputs),
            tuple((tuple(o.shape), o.dtype, o.device) for o in call.tensor_outputs))


def _clean(call: CallRecord) -> bool:
    """Nothing in this call that a fold could hide: it finished, its values and gradients are finite."""
    if call.status != "ok" or call.call != 1:
        return False
    for t in (*call.inputs, *call.outputs):
        if t.stats is not None and not t.stats.finite:
            return False
        if t.grad is not None and not t.grad.finite:
            return False
    return True


def _chained(a: CallRecord, b: CallRecord, calls: Sequence[CallRecord]) -> bool:
    """``b``'s first tensor input is ``a``'s output (a stack, not blocks side by side). The
    recorded source is the innermost call that made the tensor (``h.0.ln_2``'s output is also
    ``h.0``'s), so any call inside ``a`` counts."""
    ins = b.tensor_inputs
    if not ins or ins[0].source is None or not 0 <= ins[0].source < len(calls):
        return False
    src = calls[ins[0].source].path
    return src == a.path or src.startswith(a.path + ".")


def _alike(a: CallRecord, b: CallRecord) -> bool:
    """Numbered siblings of one class, shapes and parameter count, neither hiding a problem."""
    return (_clean(a) and _clean(b) and a.class_name == b.class_name and _parent(a.path) == _parent(b.path)
            and _numbered(a.path) and _numbered(b.path) and _shapes(a) == _shapes(b) and a.params == b.params)


def _foldable(run: List[CallRecord], calls: Sequence[CallRecord]) -> bool:
    return all(_alike(run[0], c) for c in run) and all(_chained(a, b, calls) for a, b in zip(run, run[1:]))


def rows(report: InspectReport, depth: Optional[int], fold: bool = True) -> List[Row]:
    """The rows shown at ``depth``: calls down to ``depth`` (and any that raised), a row for each
    uncalled container above them, and, when ``fold`` and a ``depth`` is given, runs of
    identical blocks folded (without ``depth`` every call keeps its row)."""
    called = {c.path for c in report.calls}
    out: List[Row] = []
    containers: Dict[str, Row] = {}
    for c in report.calls:
        parts = c.path.split(".") if c.path else []
        for k in range(1, len(parts)):
            prefix = ".".join(parts[:k])
            if prefix in called or (depth is not None and k > depth):
                continue
            if prefix not in containers:
                containers[prefix] = Row(prefix, k)
                out.append(containers[prefix])
        parent = containers.get(_parent(c.path)) if c.path else None
        if parent is not None and c.call == 1:
            parent.children.append(c)
        if depth is None or c.depth <= depth or c.status == "raised":
            out.append(Row(c.path, c.depth, call=c))
    if not fold or report.ops or depth is None:  # every row was asked for; --ops interleave with calls
        return out
    return _fold_hidden_children(_fold_runs(out, report.calls), depth, report.calls)


def _fold_runs(items: List[Row], calls: Sequence[CallRecord]) -> List[Row]:
    """Fold each maximal run of adjacent, foldable sibling calls whose children are not shown."""
    out: List[Row] = []
    i = 0
    while i < len(items):
        j = i
        if items[i].call is not None and _leaf(items, i):
            while (j + 1 < len(items) and items[j + 1].call is not None and _leaf(items, j + 1)
                   and _alike(items[i].call, items[j + 1].call)
                   and _chained(items[j].call, items[j + 1].call, calls)):
                j += 1
        run = [r.call for r in items[i:j + 1]]
        if j + 1 - i >= MIN_RUN and _foldable(run, calls):
            out.append(Row(numbered_run_label([c.path for c in run]), run[0].depth, call=run[-1], blocks=run))
            i = j + 1
        else:
            out.append(items[i])
            i += 1
    # a container whose whole content is one fold of all its children: the fold takes its place
    merged: List[Row] = []
    for r in out:
        prev = merged[-1] if merged else None
        if r.is_fold and prev is not None and prev.is_container and r.blocks == prev.children:
            merged.pop()
            r.depth = prev.depth
        merged.append(r)
    return merged


def _leaf(items: List[Row], i: int) -> bool:
    """No row after ``items[i]`` is nested in it (its children are hidden)."""
    if i + 1 >= len(items):
        return True
    path = items[i].path
    return not items[i + 1].path.startswith(path + ".") if path else False


def _fold_hidden_children(items: List[Row], depth: Optional[int], calls: Sequence[CallRecord]) -> List[Row]:
    """A container at the depth limit (its children hidden): a fold of its children when they are
    a foldable run, else it stays a container row (``N calls``)."""
    for r in items:
        if r.is_container and not r.is_fold and depth is not None and r.depth >= depth:
            kids = r.children
            if len(kids) >= 2 and _foldable(kids, calls):
                r.call, r.blocks = kids[-1], list(kids)
                r.path = numbered_run_label([c.path for c in kids])
    return items


def container_summary(row: Row) -> str:
    """``12 × BertLayer`` / ``3 calls``: what an uncalled container holds."""
    kids = row.children
    classes = {c.class_name for c in kids}
    if len(classes) == 1 and kids:
        return f"{len(kids)} × {kids[0].class_name}"
    return f"{len(kids)} call{'s' * (len(kids) != 1)}" if kids else "container"


def short_path(path: str) -> str:
    """The path below its parent, which the indentation already shows: ``word_embeddings`` for
    ``embeddings.word_embeddings``; a numbered block keeps its container (``h.0``, ``layer.0–11``),
    a bare ``0`` would say nothing."""
    parts = path.split(".")
    keep = 2 if len(parts) > 1 and parts[-1][:1].isdigit() else 1
    return ".".join(parts[-keep:])


def fold_paths(paths: Sequence[str]) -> Optional[str]:
    """``encoder.layer.{0–11}.attention.self.key.bias`` for the same path in consecutive numbered
    blocks; ``None`` when the paths are not that."""
    if len(paths) < 2:
        return None
    split = [p.split(".") for p in paths]
    if len({len(s) for s in split}) != 1:
        return None
    differ = [k for k in range(len(split[0])) if len({s[k] for s in split}) > 1]
    if len(differ) != 1 or not all(s[differ[0]].isdigit() for s in split):
        return None
    k = differ[0]
    nums = [int(s[k]) for s in split]
    if nums != list(range(nums[0], nums[0] + len(nums))):
        return None
    return ".".join(split[0][:k] + [f"{{{nums[0]}–{nums[-1]}}}"] + split[0][k + 1:])

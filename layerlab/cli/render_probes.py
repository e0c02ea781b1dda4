"""One renderer for every probe's result (:class:`~layerlab.probe.probes.base.ProbeResult`).

A probe says what to show (its ``columns`` and rows' ``values``, ``series`` and ``flags``); this
module only lays it out: the title and the probe's note, then a table with the module (its path,
``×N`` for the N-th call), one column per value, each series as a sparkline (``▁▃▆``, bucketed by
:func:`~layerlab.cli.render_fold.sparkline`; the numbers are whole in ``--json``) and the flags.
At the width it is printed at, the module names give up cells first (a readable leaf name is
kept), then the last value columns are left out one by one: a number is never cut, and the
legend says which columns did not fit. The findings are not repeated here: they are with the
report's problems and notes.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from rich.console import Group
from layerlab.text_safety import escape
from rich.text import Text

from layerlab.cli.render_common import Fit, fit_columns
from layerlab.cli.render_fold import short_path, sparkline
from layerlab.cli.render_inspect_forward import num, table

__all__ = ["probe_parts", "probe_table", "MAX_ROWS"]

#: rows shown per probe (the rest are in --json; the legend says how many)
MAX_ROWS = 60


def _value(v: Optional[float]) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if float(v).is_integer() and abs(v) < 1e7:
        return f"{int(v):,}" if abs(v) >= 1e4 else str(int(v))
    return num(v)


def _module(row: Any) -> str:
    path = row.path or "(root)"
    return path + (f" ×{row.call}" if row.call and row.call > 1 else "")


def probe_table(result: Any, width: Optional[int] = None) -> Group:
    """``result`` as a titled table laid out for ``width`` cells."""
    rows = result.rows[:MAX_ROWS]
    series_keys: List[str] = []
    for r in rows:
        for k in r.series:
            if k not in series_keys:
                series_keys.append(k)
    value_keys = [k for k in result.columns if any(k in r.values for r in rows)]
    value_keys += [k for r in rows for k in r.values if k not in value_keys and k not in result.columns]
    value_keys = list(dict.fromkeys(value_keys))
    header: Dict[str, str] = {"module": "module", "class": "class"}
    header.update({f"v:{k}": result.columns.get(k, k) for k in value_keys})
    header.update({f"s:{k}": k for k in series_keys})
    header["flags"] = ""
    body: List[Dict[str, str]] = []
    for r in rows:
        cells = {"module": _module(r), "class": r.class_name}
        cells.update({f"v:{k}": _value(r.values.get(k)) for k in value_keys})
        cells.update({f"s:{k}": sparkline(r.series[k]) if r.series.get(k) else "" for k in series_keys})
        cells["flags"] = "; ".join(r.flags)
        body.append(cells)
    need = {c: max([len(header[c])] + [Text(b[c]).cell_len for b in body]) for c in header}
    if not any(b["flags"] for b in body):
        del need["flags"]
    if not any(b["class"] for b in body):
        del need["class"]
    short = max([6] + [len(short_path(r.path or "(root)")) + (len(f" ×{r.call}") if r.call and r.call > 1 else 0)
                       for r in rows])
    soft = {"flags": min(need.get("flags", 0), 24), "module": min(need["module"], short)}
    hard = {"flags": min(need.get("flags", 0), 12), "module": min(need["module"], 12)}
    soft = {k: v for k, v in soft.items() if k in need}
    hard = {k: v for k, v in hard.items() if k in need}
    # left out first: the class (the path names the module), then values from the last, keeping
    # the first three, then the sparklines, then the rest of the values
    values = [f"v:{k}" for k in value_keys]
    drop = [c for c in ("class",) if c in need] + values[:2:-1] + [f"s:{k}" for k in reversed(series_keys)] \
        + values[2:0:-1]
    widths, pad = fit_columns(need, width, soft=soft, hard=hard, drop=drop)
    t = table("", pad=pad)
    for c, w in widths.items():
        if c in ("module", "class"):
            t.add_column(header[c], no_wrap=True, overflow="ellipsis", max_width=w)
        elif c == "flags":
            t.add_column(header[c], overflow="fold", style="yellow")
        elif c.startswith("s:"):
            t.add_column(header[c], no_wrap=True, min_width=w)
        else:
            t.add_column(header[c], justify="right", no_wrap=True, min_width=w)
    for cells in body:
        t.add_row(*(escape(cells[c]) for c in widths))
    left_out = [header[c] or c for c in need if c not in widths and c != "class"]
    legend = []
    if result.note:
        legend.append(result.note)
    if left_out:
        legend.append("not shown at this width: " + ", ".join(left_out) + " (see --json)")
    if len(result.rows) > len(rows):
        legend.append(f"first {len(rows)} of {len(result.rows)} rows; all in --json")
    head = Text.assemble((result.title or result.name, "bold"), (f"  ({'; '.join(legend)})" if legend else "", "dim"))
    return Group(head, t) if rows else Group(head)


def probe_parts(report: Any) -> List[Any]:
    """Each probe's table, laid out for the width it is printed at (none when no probe ran)."""
    return [Fit(lambda w, r=result: probe_table(r, w)) for result in getattr(report, "probes", None) or []]

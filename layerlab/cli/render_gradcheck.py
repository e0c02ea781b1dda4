"""Rich renderables for gradcheck reports (the only place that formats them for people)."""

from __future__ import annotations

from typing import Any, Dict, List

from layerlab.text_safety import displays, escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from layerlab.checks.report import CheckResult, MatrixReport, Status, VerifyReport
from layerlab.cli import render_common as C

#: short column titles of the --all matrix
SHORT = {"runs": "run", "forward_parity": "fwd", "backward_parity": "bwd", "gradcheck": "grad",
         "param_grads": "par", "batch_independence": "b-ind", "batch_consistency": "b-con",
         "causality": "caus", "recurrent_state": "state", "masks": "mask", "gradgradcheck": "grad²",
         "noncontiguous": "strd", "determinism": "det", "compile": "comp"}


@displays
def report(r: VerifyReport, verbose: bool = False) -> List[Any]:
    """Header, one row per check, then the numbers of every failure and warning."""
    parts: List[Any] = []
    head = f"[bold]gradcheck {escape(r.target)}[/]  {escape(r.module)}"
    if r.reference:
        head += f" [dim]vs[/] {escape(r.reference)}"
    parts.append(Text.from_markup(head))
    note = r.settings.get("reference_weights")
    inputs = C.inputs(r.settings.get("inputs"))
    sub = "  ".join(x for x in (f"inputs: {inputs}" if inputs else "", f"mode: {r.settings.get('mode')}",
                                f"seed {r.settings.get('seed')}", note or "") if x)
    parts.append(Text.from_markup(f"[dim]{escape(sub)}[/]"))
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("check")
    table.add_column("result", no_wrap=True)
    table.add_column("what was compared / found")
    table.add_column("where")
    for c in r.checks:
        table.add_row(c.name, C.status_cell(c.status), escape(c.summary), escape(c.where or ""))
    parts.append(table)
    for c in r.checks:
        if c.status in (Status.FAIL, Status.WARN) or (verbose and c.status == Status.PASS):
            parts.extend(_detail(c))
    counts = r.counts()
    parts.append(Text.from_markup(
        f"{C.verdict(r.ok)}: {counts['fail']} failed, {counts['pass']} passed, {counts['warn']} warning(s), "
        f"{counts['skip']} skipped  [dim]({r.seconds:.2f} s)[/]"))
    return parts


def _detail(c: CheckResult) -> List[Any]:
    mark, style = C.MARK[Status(c.status)]
    lines: List[Any] = [Text.from_markup(f"\n[{style}]{mark} {escape(c.name)}[/]"
                                         + (f"  [dim]at[/] [bold]{escape(c.where)}[/]" if c.where else ""))]
    for text in _numbers(c):
        lines.append(Padding(Text(text), (0, 0, 0, 4), expand=False))
    if c.hint:
        lines.append(Padding(Text.from_markup(f"[cyan]fix:[/] {escape(c.hint)}"), (0, 0, 0, 4), expand=False))
    return lines


def _numbers(c: CheckResult) -> List[str]:
    """The measured numbers worth printing, per kind of detail."""
    d: Dict[str, Any] = c.details
    out: List[str] = []
    comps = list(d.get("comparisons", []))
    for run in d.get("runs", []):
        comps += [dict(x, what=f"{x['what']} ({run['dtype']})") for x in run["comparisons"]]
    for x in comps:
        if x.get("ok") and c.status != Status.PASS:
            continue
        out.append(_comparison(x))
    if "divergence" in d:
        out.append(f"first divergence: {d['divergence']['where']}")
    rows = [r for r in d.get("directional", []) if not r["ok"] or c.status == Status.PASS]
    for r in rows[:8]:
        ratio = f"  ratio {r['ratio']:.4g}" if "ratio" in r else ""
        out.append(f"d{r['output']}/d{r['tensor']} ({r['kind']}): analytical {r['analytical']:.6g}, numerical "
                   f"{r['numerical']:.6g}, |diff| {r['abs_diff']:.3g} > allowed {r['allowed']:.3g}{ratio}"
                   if not r["ok"] else
                   f"closest of {d.get('pairs_checked', len(rows))} pairs to its tolerance: d{r['output']}/"
                   f"d{r['tensor']}: analytical {r['analytical']:.6g}, numerical {r['numerical']:.6g}, "
                   f"|diff| {r['abs_diff']:.3g} ≤ {r['allowed']:.3g}")
    if "directional" in d:
        out.extend(_gradcheck_notes(d))
    for s in d.get("slow", []):
        out.append(f"slow mode on {s['tensor']}: " + (s.get("message", "") if s.get("ran") else f"skipped, {s['reason']}"))
    for leak in d.get("leaks", [])[:4]:
        out.append(f"∂{leak['output']}[sample {leak['sample']}]/∂{leak['input']}[sample {leak['other_sample']}]: "
                   f"max |grad| {leak['max_abs_grad']:.3g} (own sample {leak['own_max_abs_grad']:.3g})")
    if d.get("first_mixing_module"):
        out.append(f"first module whose output mixes the batch: {d['first_mixing_module']}")
    if "first_leaking_position" in d:
        out.append(f"first leaking position t = {d['first_leaking_position']} (sees input position "
                   f"{d.get('leaks_from')}), max change {d.get('max_change', 0):.3g}")
    for p in d.get("problems", []):
        out.append(f"{p['where']}: {p['problem']}")
    for f in d.get("findings", []):
        out.append(f"{f['status']}: {f['message']}")
    for p in d.get("params", []):
        if not p["present"] or not p.get("finite", True) or p.get("zero"):
            out.append(f"{p['name']}: " + ("no gradient" if not p["present"] else
                                           "non-finite" if not p.get("finite", True) else "all zero"))
    if "exception" in d and "failing_inputs" in d:
        out.append(f"{d['failing_module']} got inputs {d['failing_inputs']}")
        for step in d.get("ran_before", [])[-5:]:
            out.append(f"  ran before: {step['module']} ({step['type']}) {step['inputs']} → {step['outputs']}")
    if "formula" in d and d["formula"].get("predicted"):
        f = d["formula"]
        out.append(f"formula {f['call']}: predicted {f['predicted']}, got {f['actual']}")
    return out


def _gradcheck_notes(d: Dict[str, Any]) -> List[str]:
    """Tolerances, low-precision ops and coverage of the numerical gradient check."""
    out = []
    if isinstance(d["atol"], list):  # low precision: one measured atol per output
        atol = ", ".join(f"{a:.3g}" for a in d["atol"][:4])
        out.append(f"tolerances: eps {d['eps']:g} and {4 * d['eps']:g}, atol {atol}, rtol {d['rtol']:g}, "
                   "plus 4× the spread between the two steps")
    else:
        out.append(f"tolerances: eps {d['eps']:g}, atol {d['atol']:g}·Σu·Σv, rtol {d['rtol']:g}; Jacobian "
                   f"{d['jacobian_elements']:,} elements (slow-mode cap {d['slow_cap']:,})")
    low = d.get("low_precision")
    if low:
        ops = "; ".join(f"{o['op']} → {o['dtype']} at {o['source'] or '?'}" + (f" ×{o['count']}" if o["count"] > 1 else "")
                        for o in low["ops"][:6])
        out.append(f"computes in {low['dtype']} inside the float64 run: {ops}")
    cov = d.get("coverage") or {}
    if cov.get("sampled"):
        left = ", ".join(cov["not_checked"][:6]) + (" …" if cov["not_checked_count"] > 6 else "")
        out.append(f"checked {cov['tensors_checked']} of {cov['tensors_total']} tensors "
                   f"(≤ {cov['max_entries_per_tensor']:,} entries each); not checked: {left}")
    return out


def _comparison(x: Dict[str, Any]) -> str:
    if x.get("note") and not x.get("total"):
        return f"{x['what']}: {x['note']}"
    head = f"{x['what']}: {x['mismatched']}/{x['total']} ({x['mismatched_pct']:.1f}%) mismatched"
    idx = lambda i: "—" if i is None else "[" + ", ".join(map(str, i)) + "]"  # noqa: E731
    text = (f"{head}; greatest abs diff {x['max_abs_diff']:.3g} at {idx(x['max_abs_index'])} "
            f"({x['actual_at_max']:.6g} vs {x['expected_at_max']:.6g}), greatest rel diff {x['max_rel_diff']:.3g} "
            f"at {idx(x['max_rel_index'])}; rtol {x['rtol']:g}, atol {x['atol']:g}")
    if x.get("note"):
        text += f" ({x['note']})"
    return text


@displays
def matrix(m: MatrixReport, verbose: bool = False) -> List[Any]:
    """Layers × checks, then one line per failure (check, where, what)."""
    rows = [(r.target, {c.name: C.status_mark(c.status) for c in r.checks})
            for r in m.reports]
    table = C.matrix_table(rows, m.check_names, SHORT, justify="center")
    legend = "  ".join(f"{SHORT.get(n, n)} {n}" for n in m.check_names)
    parts: List[Any] = [table, Text.from_markup("[dim]✓ pass  ✗ fail  ! warning  · skipped (does not apply)[/]"),
                        Text.from_markup(f"[dim]{escape(legend)}[/]")]
    for r in m.reports:
        for c in r.checks:
            if c.status == Status.FAIL or (verbose and c.status == Status.WARN):
                where = f" at {c.where}" if c.where else ""
                parts.append(Text.from_markup(f"[bold red]✗[/] {escape(r.target)} · {escape(c.name)}{escape(where)}: "
                                              f"{escape(c.summary)}"))
    failed = [r.target for r in m.reports if not r.ok]
    parts.append(Text.from_markup(f"{C.verdict(m.ok)}: {len(m.reports)} layer{'s' if len(m.reports) != 1 else ''}, {len(failed)} failed  "
                                  f"[dim]({m.seconds:.1f} s)[/]"))
    return parts

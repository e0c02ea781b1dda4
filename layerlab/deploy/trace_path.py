"""The ``trace`` path: ``torch.jit.trace``, compared with eager on the example and the variants.

Fails if tracing raises or the trace disagrees with eager on the example. Warns when the trace is
input-specific: a TracerWarning (a tensor turned into a Python bool, int or float: the branch or
size is frozen), or another batch size, length or sign of the inputs (see
:mod:`layerlab.deploy.variants`) where eager runs and the trace raises or differs. A dict output,
which the strict trace refuses, is traced again with ``strict=False`` and compared the same way,
so the hint that offers it has been tried.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional

import torch

from layerlab.checks.report import Status
from layerlab.deploy.cells import _check_variants, _matches, _on_example, _raised, _result
from layerlab.deploy.context import Context, fresh_args, quiet
from layerlab.deploy.messages import first_line, short_path
from layerlab.deploy.report import PathResult


def trace(ctx: Context) -> PathResult:
    module = ctx.fresh()
    pos, kw = ctx.split()
    by_name = ctx.as_kwargs(fresh_args(ctx.args)) if kw else None  # a copy: forward may write into it
    with quiet(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.no_grad():
                if by_name is not None:
                    traced = torch.jit.trace(module, example_kwarg_inputs=by_name, check_trace=False)
                else:
                    traced = torch.jit.trace(module, tuple(pos), check_trace=False)
        except Exception as exc:
            failed = _raised(ctx, "trace", exc, "tracing raised",
                             hint="torch.jit.trace runs forward once on tensors it records; try torch.export")
            plain = _non_tensor_inputs(by_name, str(exc))
            if plain and "can be inputs to traced functions" in str(exc):
                # torch's interface, not the model: trace takes tensors only; a flag must be bound first
                failed.hint = (f"torch.jit.trace takes tensors only, and {', '.join(plain)} is not one: bind it "
                               f"before tracing (functools.partial or a wrapper module: the trace bakes it in "
                               f"anyway), or use torch.export (it takes plain values)")
                failed.details["non_tensor_inputs"] = plain
            if "Encountering a dict" in str(exc):  # verify the strict=False the hint offers
                relaxed = _relaxed_trace(ctx, pos, by_name)
                failed.details["strict_false"] = relaxed
                failed.reason += f"; {relaxed}"
            return failed
        tracer = _tracer_warnings(caught)
        if by_name is not None:
            def run(*p, **k):
                return traced(**ctx.as_kwargs([*_as_args(p), *_as_args(k, keyword=True)]))
        else:
            def run(*p, **k):
                return traced(*p)
        details: Dict[str, Any] = {"tracer_warnings": tracer}
        failed, comps = _on_example(ctx, "trace", run, "the traced module raised on its own example",
                                    "the trace differs from eager", details=details)
        if failed is not None:
            return failed
        problems, more, tried = _check_variants(ctx, run)
    details["variants"] = tried
    where = tracer[0]["where"] if tracer else None
    hint = ("the trace froze a Python value computed from a tensor (a shape, a branch, a loop count): "
            "use torch.export with Dim for dynamic sizes, or torch.jit.script")
    if problems:
        extra = f"; {len(tracer)} TracerWarning(s)" if tracer else ""
        return _result(ctx, "trace", Status.WARN, f"input-specific: {problems[0]}{extra}", where=where, hint=hint,
                       matches_eager=True, comparisons=comps + more, details=dict(details, problems=problems))
    if tracer:
        still = f"; at {', '.join(tried)} it still equals eager" if tried else ""
        return _result(ctx, "trace", Status.WARN, f"TracerWarning: {tracer[0]['message']}{still}", where=where,
                       hint=hint,
                       matches_eager=True, comparisons=comps + more, details=details)
    tail = f" and at {', '.join(tried)}" if tried else ""
    return _result(ctx, "trace", Status.PASS, f"the trace equals eager on the example{tail}", matches_eager=True,
                   comparisons=comps + more, details=details)


def _relaxed_trace(ctx: Context, pos: list, by_name: Optional[Dict[str, Any]]) -> str:
    """What ``torch.jit.trace(..., strict=False)`` does with a model whose dict output the strict trace
    refused: traced and compared with eager on the example and the variants, as a trace cell is."""
    try:
        with torch.no_grad():
            if by_name is not None:
                traced = torch.jit.trace(ctx.fresh(), example_kwarg_inputs=by_name, check_trace=False, strict=False)
            else:
                traced = torch.jit.trace(ctx.fresh(), tuple(pos), check_trace=False, strict=False)
    except Exception as exc:
        return f"with strict=False tracing raises too: {first_line(exc)}"

    def run(*p, **k):
        if by_name is not None:
            return traced(**ctx.as_kwargs([*_as_args(p), *_as_args(k, keyword=True)]))
        return traced(*p)

    pos_now, kw_now = ctx.split()
    try:
        with torch.no_grad(), ctx.seeded():
            got = run(*pos_now, **kw_now)
    except Exception as exc:
        return f"with strict=False it traces, then raises on its own example: {first_line(exc)}"
    ok, _, problem = _matches(ctx, got)
    if not ok:
        return f"with strict=False it traces, but differs from eager: {problem}"
    problems, _, tried = _check_variants(ctx, run)
    if problems:
        return f"with strict=False it traces and equals eager on the example, but {problems[0]}"
    at = f" and at {', '.join(tried)}" if tried else ""
    return f"with strict=False it traces and equals eager on the example{at} (checked)"


def _non_tensor_inputs(by_name: Optional[Dict[str, Any]], message: str = "") -> List[str]:
    """``name=value`` of the example's arguments that hold no tensor (those of the type torch's message
    names, "… Got bool", where it names one)."""
    import re

    from layerlab.target.bind import flatten

    plain = {name: value for name, value in (by_name or {}).items()
             if not isinstance(value, torch.Tensor) and not flatten(value)}
    named = re.search(r"Got (\w+)\s*$", message.strip())
    if named:
        plain = {n: v for n, v in plain.items() if type(v).__name__ == named.group(1)} or plain
    return [f"{name}={value!r}"[:60] for name, value in plain.items()]


def _as_args(values, keyword: bool = False):
    from layerlab.target.bind import Arg

    if keyword:
        return [Arg(k, v, True) for k, v in values.items()]
    return [Arg(f"_{i}", v, False) for i, v in enumerate(values)]


def _tracer_warnings(caught) -> List[Dict[str, Any]]:
    """TracerWarnings, one per source line: what was frozen and where."""
    out, seen = [], set()
    for w in caught:
        if not issubclass(w.category, torch.jit.TracerWarning):
            continue
        key = (w.filename, w.lineno)
        if key in seen:
            continue
        seen.add(key)
        text = str(w.message).strip().split(". ")[0]
        out.append({"where": f"{short_path(w.filename)}:{w.lineno}", "message": text})
    return out

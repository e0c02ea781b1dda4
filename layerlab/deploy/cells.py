"""What every export-path cell does with a program: run it next to eager, compare, and say why.

The cell builders shared by :mod:`layerlab.deploy.paths` and :mod:`layerlab.deploy.trace_path`: a
result with the context's tolerances, a FAIL from an exception (its user line and the most specific
hint), the program on the example, and on every input variant where eager runs.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import torch

from layerlab.checks.report import Status
from layerlab.deploy.context import Context
from layerlab.deploy.messages import first_line, user_location
from layerlab.deploy.report import PathResult


def _result(ctx: Context, path: str, status: Status, reason: str, **kw: Any) -> PathResult:
    return PathResult(path, status, reason, rtol=ctx.rtol, atol=ctx.atol, **kw)


def _raised(ctx: Context, path: str, exc: BaseException, what: str, hint: Optional[str] = None) -> PathResult:
    """A FAIL from ``exc``; an output torch cannot flatten or trace overrides the path's usual ``hint``."""
    from layerlab.deploy.causes import cause_hint
    from layerlab.deploy.hints import output_hint

    innermost = "first" if path in ("script", "trace") else "last"
    where = user_location(str(exc), innermost)
    hint = output_hint(exc, ctx.eager_out, path) or cause_hint(exc, path, ctx.module, where) or hint
    return _result(ctx, path, Status.FAIL, f"{what}: {first_line(exc)}", where=where, hint=hint,
                   details={"exception": type(exc).__name__, "message": str(exc)[:2000]})


def _check_variants(ctx: Context, run: Callable[..., Any], variants=None) -> tuple:
    """Run ``run(*pos, **kw)`` on each variant where eager runs: ``(problems, comparisons, tried)``."""
    problems, comps, tried = [], [], []
    for v in ctx.variants if variants is None else variants:
        expected = ctx.variant_eager(v)
        if expected is None:
            continue
        tried.append(v.description)
        pos, kw = ctx.split(v.args)
        try:
            with torch.no_grad(), ctx.seeded():  # eager's run on this variant started from this RNG state too
                got = run(*pos, **kw)
        except Exception as exc:
            problems.append(f"at {v.description} it raises {first_line(exc)}")
            continue
        ok, c, problem = ctx.compare(got, expected)
        comps += c
        if not ok:
            problems.append(f"at {v.description} {problem}")
    return problems, comps, tried


def _matches(ctx: Context, got: Any) -> tuple:
    return ctx.compare(got, ctx.eager_out, "example")


def _on_example(ctx: Context, path: str, run: Callable[..., Any], raised: str, differs: str,
                **fail: Any) -> Tuple[Optional[PathResult], List[dict]]:
    """Run the program on the example and compare with eager: ``(FAIL result or None, comparisons)``.

    ``raised`` / ``differs`` start the reason when it raises / when its outputs differ; ``fail``
    goes into that FAIL result too.
    """
    pos, kw = ctx.split()
    try:
        with torch.no_grad(), ctx.seeded():  # the RNG state eager's run started from
            got = run(*pos, **kw)
    except Exception as exc:
        return _raised(ctx, path, exc, raised), []
    ok, comps, problem = _matches(ctx, got)
    if not ok:
        return _result(ctx, path, Status.FAIL, f"{differs}: {problem}", matches_eager=False, comparisons=comps,
                       **fail), comps
    return None, comps

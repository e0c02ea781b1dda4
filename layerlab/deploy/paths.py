"""One function per export path: run it on the layer, compare with eager, say pass / warn / fail and why.

* ``trace``: ``torch.jit.trace``: see :mod:`layerlab.deploy.trace_path`.
* ``script``: ``torch.jit.script``: compiles the Python source, so it fails on what TorchScript
  cannot type; outputs are compared on the example and every variant, and the module is saved
  (``torch.jit.save``, to memory): one that runs but cannot be saved (a ``@torch.jit.ignore``'d
  Python method) deploys nowhere, so it fails.
* ``compile``: ``torch.compile(fullgraph=True)`` with ``backend`` (``aot_eager`` by default: it
  checks that Dynamo captures one graph and AOTAutograd traces it, without inductor's C++ build;
  ``inductor`` compiles for real). A graph break is a warning when the layer still compiles with
  breaks (``fullgraph=False``) and matches eager; the reason is Dynamo's.
* ``export``: ``torch.export.export`` with static shapes; the exported program's module is run.
* ``export_dynamic``: the same with every batch dim a ``Dim("batch")``, then run at batch B + 1.
  Warns when the code specialises the batch size (export refuses the Dim) or the program
  disagrees at the new batch; fails when even the static export fails.
* ``onnx``: see :mod:`layerlab.deploy.onnx`.

Every program run that is compared with eager starts from the RNG state eager's run started from
(:meth:`~layerlab.deploy.context.Context.seeded`), so ``torch.randn_like`` in forward is no reason
to differ.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional

import torch

from layerlab.checks.report import Status
from layerlab.deploy.cells import _check_variants, _matches, _on_example, _raised, _result
from layerlab.deploy.context import Context, quiet
from layerlab.deploy.messages import first_line, user_location
from layerlab.deploy.pinned import export_pinning
from layerlab.deploy.report import PathResult
from layerlab.deploy.trace_path import trace


# -- torch.jit.script --------------------------------------------------------------------------------

def script(ctx: Context) -> PathResult:
    with quiet():
        try:
            scripted = torch.jit.script(ctx.fresh())
        except Exception as exc:
            return _raised(ctx, "script", exc, "scripting raised",
                           hint="TorchScript needs typed, static Python: annotate arguments, avoid **kwargs, "
                                "closures and dynamic attributes — or use torch.export")
        failed, comps = _on_example(ctx, "script", scripted, "the scripted module raised on the example",
                                    "the script differs from eager")
        if failed is not None:
            return failed
        problems, more, tried = _check_variants(ctx, scripted)
        unsaved = _save_error(scripted)
    if problems:
        return _result(ctx, "script", Status.FAIL, f"the script differs from eager {problems[0]}",
                       matches_eager=True, comparisons=comps + more, details={"variants": tried, "problems": problems})
    if unsaved is not None:  # it runs here, but a TorchScript module that cannot be saved deploys nowhere
        from layerlab.deploy.causes import SAVE_HINT

        return _result(ctx, "script", Status.FAIL, f"scripted and equals eager here, but torch.jit.save refuses it: "
                       f"{first_line(unsaved).split('. ')[0]}", where=user_location(str(unsaved), "first"), hint=SAVE_HINT,
                       matches_eager=True, comparisons=comps + more,
                       details={"variants": tried, "exception": type(unsaved).__name__, "message": str(unsaved)[:2000]})
    tail = f" and at {', '.join(tried)}" if tried else ""
    return _result(ctx, "script", Status.PASS, f"scripted; equals eager on the example{tail}", matches_eager=True,
                   comparisons=comps + more, details={"variants": tried})


def _save_error(scripted: Any) -> Optional[BaseException]:
    """What ``torch.jit.save`` raises on the scripted module (to memory), or ``None``."""
    import io

    try:
        torch.jit.save(scripted, io.BytesIO())
    except Exception as exc:
        return exc
    return None


# -- torch.compile -----------------------------------------------------------------------------------

def compile(ctx: Context) -> PathResult:  # noqa: A001 - the path's name
    import torch._dynamo as dynamo

    backend = ctx.compile_backend
    pos, kw = ctx.split()
    details: Dict[str, Any] = {"backend": backend}
    with quiet():
        dynamo.reset()
        try:
            compiled = torch.compile(ctx.fresh(), fullgraph=True, backend=backend)
            with torch.no_grad(), ctx.seeded():
                got = compiled(*pos, **kw)
        except dynamo.exc.Unsupported as exc:
            return _graph_breaks(ctx, exc, details)
        except Exception as exc:
            return _raised(ctx, "compile", exc, f"torch.compile (backend {backend}) raised")
        ok, comps, problem = _matches(ctx, got)
        if not ok:
            dynamo.reset()
            return _result(ctx, "compile", Status.FAIL, f"compiled output differs from eager: {problem}",
                           matches_eager=False, comparisons=comps, details=details)
        batch = [v for v in ctx.variants if v.name == "batch"]
        problems, more, tried = _check_variants(ctx, compiled, batch)
        dynamo.reset()
    details["variants"] = tried
    if problems:
        return _result(ctx, "compile", Status.FAIL, f"compiled output differs from eager {problems[0]}",
                       matches_eager=True, comparisons=comps + more, details=dict(details, problems=problems))
    return _result(ctx, "compile", Status.PASS, f"one graph (backend {backend}); equals eager"
                   + (f" also at {tried[0]}" if tried else ""), matches_eager=True, comparisons=comps + more,
                   details=details)


def _graph_breaks(ctx: Context, exc: BaseException, details: Dict[str, Any]) -> PathResult:
    """fullgraph=True refused: count the breaks with explain, then see if it runs in pieces."""
    import torch._dynamo as dynamo

    reason = first_line(exc).split(": ", 1)[-1]
    where = user_location(str(exc))
    pos, kw = ctx.split()
    details.update(exception=type(exc).__name__, message=str(exc)[:2000])
    try:
        dynamo.reset()
        explained = dynamo.explain(ctx.fresh())(*pos, **kw)
        details["graph_breaks"] = max(int(explained.graph_break_count), 0)
        details["graphs"] = int(explained.graph_count)
        details["break_reasons"] = [str(getattr(b, "reason", b)).splitlines()[0] for b in explained.break_reasons][:5]
    except Exception as e:  # explain itself gave up; the fullgraph error is the reason
        details["explain_error"] = first_line(e)
    n = details.get("graph_breaks") or 0
    count = f"{n} graph break(s)" if n else "graph break"
    try:
        dynamo.reset()
        loose = torch.compile(ctx.fresh(), fullgraph=False, backend=ctx.compile_backend)
        with torch.no_grad(), ctx.seeded():
            got = loose(*pos, **kw)
    except Exception as e:
        dynamo.reset()
        return _result(ctx, "compile", Status.FAIL, f"{count}: {reason}; without fullgraph it raises {first_line(e)}",
                       where=where, details=details)
    ok, comps, problem = _matches(ctx, got)
    dynamo.reset()
    hint = "the layer compiles in pieces around the break; remove the break to export one graph"
    if not ok:
        return _result(ctx, "compile", Status.FAIL, f"{count}: {reason}; and the pieces differ from eager: {problem}",
                       where=where, matches_eager=False, comparisons=comps, details=details)
    return _result(ctx, "compile", Status.WARN, f"{count}: {reason} (runs in pieces, equals eager)", where=where,
                   hint=hint, matches_eager=True, comparisons=comps, details=details)


# -- torch.export ------------------------------------------------------------------------------------

def _export(ctx: Context, dynamic_shapes: Any = None):
    pos, kw = ctx.split()
    return torch.export.export(ctx.fresh(), tuple(pos), kwargs=kw or None, dynamic_shapes=dynamic_shapes)


def export(ctx: Context) -> PathResult:
    with quiet():
        try:
            program = _export(ctx)
        except Exception as exc:
            return _raised(ctx, "export", exc, "torch.export raised",
                           hint="data-dependent Python control flow needs torch.cond; .item()/int() on tensors "
                                "needs torch._check")
        failed, comps = _on_example(ctx, "export", lambda *p, **k: program.module()(*p, **k),
                                    "the exported program raised on its own example",
                                    "the exported program differs from eager")
    if failed is not None:
        return failed
    return _result(ctx, "export", Status.PASS, "exported (static shapes); equals eager", matches_eager=True,
                   comparisons=comps)


def export_dynamic(ctx: Context) -> PathResult:
    batch = next((v for v in ctx.variants if v.name == "batch"), None)
    if batch is None:
        return _result(ctx, "export_dynamic", Status.SKIP, "no batched input: nothing to make dynamic")
    shapes, B = _batch_shapes(ctx)
    if B < 2:
        return _result(ctx, "export_dynamic", Status.SKIP, f"batch size {B}: export cannot mark a size < 2 dynamic")
    made: List[Any] = []
    with quiet():
        exc, pinned_at = export_pinning(lambda: made.append(_export(ctx, shapes)), B)
        if exc is not None:
            static = None
            try:
                _export(ctx)
            except Exception as exc2:
                static = exc2
            if static is not None:
                return _raised(ctx, "export_dynamic", static, "torch.export raised (static shapes too)")
            return _result(ctx, "export_dynamic", Status.WARN, f"batch size baked in: {first_line(exc)}",
                           where=pinned_at or user_location(str(exc)),
                           hint="the forward uses the batch size as a Python int: a hard-coded view/reshape "
                           "(view(8, -1): write view(x.shape[0], -1)) or a Python loop over samples (vectorise it "
                           "over the batch dim)",
                           details={"exception": type(exc).__name__, "message": str(exc)[:2000]})
        program = made[0]
        failed, comps = _on_example(ctx, "export_dynamic", lambda *p, **k: program.module()(*p, **k),
                                    "the exported program raised on its own example",
                                    "the exported program differs from eager")
        if failed is not None:
            return failed
        problems, more, tried = _check_variants(ctx, program.module(), [batch])
    if problems:
        return _result(ctx, "export_dynamic", Status.WARN, f"dynamic batch exported, but {problems[0]}",
                       matches_eager=True, comparisons=comps + more, details={"variants": tried})
    return _result(ctx, "export_dynamic", Status.PASS, f"batch dim dynamic; equals eager at {B} and {B + 1}",
                   matches_eager=True, comparisons=comps + more, details={"variants": tried})


def _batch_shapes(ctx: Context):
    """``dynamic_shapes`` by forward parameter name: ``{batch_dim: Dim('batch')}`` per batched tensor."""
    from layerlab.checks.case import Case, batch_layout

    case = Case(module=ctx.module, args=ctx.args, target="", batch_dims=dict(ctx.batch_dims))
    B, dims = batch_layout(case, ctx.args)
    dim = torch.export.Dim("batch")

    def spec(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            d = dims.get(id(value))
            return {d: dim} if d is not None else None
        if isinstance(value, (tuple, list)):
            return type(value)(spec(v) for v in value)
        if isinstance(value, dict):
            return {k: spec(v) for k, v in value.items()}
        return None

    return {name: spec(v) for name, v in ctx.as_kwargs().items()}, B


#: path name → function (the ONNX path is added by :mod:`layerlab.deploy.run`)
PATH_FUNCTIONS: Dict[str, Callable[[Context], PathResult]] = {
    "trace": trace,
    "script": script,
    "compile": compile,
    "export": export,
    "export_dynamic": export_dynamic,
}


def timed(fn: Callable[[Context], PathResult], ctx: Context) -> PathResult:
    start = time.perf_counter()
    result = fn(ctx)
    result.seconds = time.perf_counter() - start
    return result

"""``layerlab.export_check``: which deployment paths a layer survives, and whether their outputs equal eager's.

    >>> import torch, layerlab
    >>> report = layerlab.export_check(torch.nn.LSTM(8, 16, batch_first=True), torch.randn(4, 7, 8))
    >>> [(r.path, r.status.value) for r in report.paths]
    [('trace', 'warn'), ('script', 'fail'), ('compile', 'warn'), ('export', 'pass'), ('export_dynamic', 'pass'),
     ('onnx', 'pass')]

Paths (:data:`~layerlab.deploy.report.PATHS`): ``torch.jit.trace``, ``torch.jit.script``,
``torch.compile(fullgraph=True)``, ``torch.export.export`` (static, and with a dynamic batch dim),
and ONNX run through onnxruntime. See :mod:`layerlab.deploy.paths` for what makes each cell pass,
warn or fail. The layer runs in eval mode, under ``torch.no_grad()``, on copies: the module and
inputs passed in are left as they were, and so is the caller's RNG state (the whole check runs in
:func:`torch.random.fork_rng`; every compared run starts from one seeded state, see
:mod:`layerlab.deploy.context`).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from layerlab.backends import DEFAULT_COMPILE_BACKEND
from layerlab.deploy.report import PATHS, ExportMatrix, ExportReport, PathResult
from layerlab.errors import UsageError, debug_enabled
from layerlab.target.entry import entry_point

__all__ = ["export_check", "export_check_args", "check_target", "check_all", "select_paths"]

#: ``progress(what, i, n)``: called before the eager run (``i = 0``) and before each path
Progress = Callable[[str, int, int], None]


def select_paths(only: Optional[Iterable[str]]) -> List[str]:
    """The paths to run, in column order; an unknown name is a usage error with did-you-mean."""
    if not only:
        return list(PATHS)
    names = [n.strip().replace("-", "_") for n in only if n.strip()]
    unknown = [n for n in names if n not in PATHS]
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], PATHS, n=1)
        raise UsageError(f"no export path called {unknown[0]!r}", where="--paths", expected=", ".join(PATHS),
                         got=unknown[0], hint=f"did you mean {close[0]!r}?" if close else None)
    return [p for p in PATHS if p in names]


@entry_point("export-check")
def export_check(module: Any, *inputs: Any, paths: Optional[Sequence[str]] = None,
                 compile_backend: str = DEFAULT_COMPILE_BACKEND, rtol: Optional[float] = None,
                 atol: Optional[float] = None, seed: int = 0, target: Optional[str] = None,
                 batch_dims: Optional[Dict[str, Optional[int]]] = None,
                 forward_kwargs: Optional[Dict[str, Any]] = None, **kwargs: Any) -> ExportReport:
    """Try every export path on ``module(*inputs, **kwargs)``; return an :class:`ExportReport`.

    Args:
        module (nn.Module): the layer (left unchanged; every path works on a deep copy in eval mode).
        *inputs: positional forward arguments (the example).
        paths (sequence of str, optional): run only these (:data:`PATHS`). Default: all.
        compile_backend (str, optional): ``torch.compile`` backend. ``"aot_eager"`` checks full-graph
            capture without building C++ (fast); ``"inductor"`` compiles for real. Default: ``"aot_eager"``
            (:mod:`layerlab.backends` says why).
        rtol, atol (float, optional): tolerances of the output comparisons. Default: per dtype
            (float32: 1e-4, 1e-5; see :data:`layerlab.deploy.context.TOLERANCES`).
        seed (int, optional): seed of the variant inputs. Default: ``0``.
        target (str, optional): the name shown. Default: the class name.
        batch_dims (dict, optional): input name → batch dim, where the guess is wrong.
        forward_kwargs (dict, optional): keyword forward arguments whose names clash with the above.
        **kwargs: keyword forward arguments (``attn_mask=…``).
    """
    from layerlab.arguments import check_module, check_seed
    from layerlab.target import from_module

    check_module(module, "layerlab.export_check")
    check_seed(seed)
    t = from_module(module, *inputs, seed=seed, name=target, batch_dims=batch_dims, forward_kwargs=forward_kwargs,
                    **kwargs)
    return check_target(t, paths=paths, compile_backend=compile_backend, rtol=rtol, atol=atol)


def export_check_args(module: Any, args: List[Any], *, paths: Optional[Sequence[str]] = None,
                      compile_backend: str = DEFAULT_COMPILE_BACKEND, rtol: Optional[float] = None,
                      atol: Optional[float] = None, seed: int = 0, target: str = "",
                      batch_dims: Optional[Dict[str, Optional[int]]] = None,
                      tags: frozenset = frozenset(), progress: Optional[Progress] = None) -> ExportReport:
    """:func:`export_check` on ready-made :class:`~layerlab.target.bind.Arg` inputs; ``progress(path, i, n)``
    is called before each path (an inductor compile or an ONNX export can take many seconds)."""
    import torch

    from layerlab.deploy import paths as P
    from layerlab.target.bind import class_path
    from layerlab.deploy.context import Context, detached, tolerances_for
    from layerlab.deploy.onnx import onnx
    from layerlab.deploy.variants import make_variants

    from layerlab.arguments import check_module, check_not_meta, check_tolerance

    check_module(module, "layerlab.export_check")
    check_tolerance(rtol, "rtol")
    check_tolerance(atol, "atol")
    check_not_meta(module, [a.value for a in args])  # every path compares values with eager's
    selected = select_paths(paths)
    t0 = time.perf_counter()
    args = detached(args)
    d_rtol, d_atol = tolerances_for(args, module)
    ctx = Context(module=module, args=args, variants=[], rtol=d_rtol if rtol is None else rtol,
                  atol=d_atol if atol is None else atol, compile_backend=compile_backend,
                  batch_dims=dict(batch_dims or {}), seed=seed)
    settings = {"mode": "eval", "compile_backend": compile_backend, "rtol": ctx.rtol, "atol": ctx.atol,
                "seed": seed, "inputs": {a.name: _describe(a.value) for a in args}}
    functions: Dict[str, Callable] = dict(P.PATH_FUNCTIONS, onnx=onnx)
    ctx.eager_module()  # a model copy_model cannot copy is a usage error, not an "eager forward raised" row
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # small example tensors: one thread is fastest and keeps runs repeatable
    rng = contextlib.ExitStack()
    try:
        from layerlab.target.seeding import cuda_devices

        # tracing and exporting run forward unseeded: they must not advance the caller's RNG stream
        rng.enter_context(torch.random.fork_rng(devices=cuda_devices(module, _tensors(args))))
        pos, kw = ctx.split()
        if progress is not None:
            progress("eager run and input variants", 0, len(selected) + 1)
        try:
            with torch.no_grad(), ctx.seeded():  # every program run starts from this RNG state too
                ctx.eager_out = ctx.module_eval(*pos, **kw)
            _note_changed_inputs(ctx, pos, kw, settings)
        except Exception as exc:
            from layerlab.deploy.messages import first_line
            from layerlab.checks.report import Status

            reason = f"eager forward raised {first_line(exc)}"
            results = [PathResult(p, Status.FAIL, reason) for p in selected]
            return ExportReport(target, class_path(module), results, settings, time.perf_counter() - t0)
        constant = _constant_eager(ctx, settings, seed)
        drift = _eager_drift(ctx, settings, seed)
        ctx.variants = make_variants(ctx.module, args, seed=seed, batch_dims=batch_dims, tags=tags)
        settings["variants"] = [v.description for v in ctx.variants]
        results: List[PathResult] = []
        for i, name in enumerate(selected, start=1):
            if progress is not None:
                progress(name, i, len(selected) + 1)
            try:
                results.append(P.timed(functions[name], ctx))
            except Exception as exc:  # a bug in a path function must not hide the other cells
                if debug_enabled():
                    raise
                from layerlab.checks.report import Status
                from layerlab.deploy.messages import first_line

                results.append(PathResult(name, Status.FAIL, f"layerlab's check raised {first_line(exc)}",
                                          hint="LAYERLAB_DEBUG=1 shows the traceback"))
        from layerlab.deploy.repeatable import mark_unrepeatable
        from layerlab.deploy.vacuous import mark_reinitialised, mark_vacuous

        if drift is not None:
            mark_unrepeatable(results, drift)
        elif constant is not None:
            mark_vacuous(results, constant)
        elif settings.get("reinitialised"):
            mark_reinitialised(results, settings["reinitialised"])
    finally:
        rng.close()
        torch.set_num_threads(previous)
    return ExportReport(target, class_path(module), results, settings, time.perf_counter() - t0)


def _note_changed_inputs(ctx, pos: list, kw: dict, settings: Dict[str, Any]) -> None:
    """Say which inputs eager's forward wrote into (every path then gets its own fresh copy)."""
    from layerlab.deploy.context import changed_inputs
    from layerlab.target.bind import Arg

    ran = [Arg(a.name, v, a.keyword) for a, v in zip([a for a in ctx.args if not a.keyword], pos)]
    ran += [Arg(a.name, kw[a.name], True) for a in ctx.args if a.keyword]
    before = [a for a in ctx.args if not a.keyword] + [a for a in ctx.args if a.keyword]
    changed = changed_inputs(before, ran)
    if changed:
        settings["inputs_written"] = changed
        settings.setdefault("notes", []).append(
            f"forward writes into its input(s) {', '.join(changed)} in place: every run (eager and each path) was "
            f"given its own copy of the inputs")


def _eager_drift(ctx, settings: Dict[str, Any], seed: int) -> Optional[dict]:
    """Two more seeded eager calls (:mod:`layerlab.deploy.repeatable`); a note when they differ."""
    from layerlab.deploy.repeatable import eager_drift

    try:
        drift = eager_drift(ctx)
    except Exception:  # eager ran once already; a second call that raises is the layer's business
        return None
    if drift is not None:
        settings["eager_not_repeatable"] = drift["problem"]
        settings.setdefault("notes", []).append(
            f"eager is not repeatable: a second call on the same input differs ({drift['problem']}), so "
            f"outputs cannot be compared with it")
    return drift


def _constant_eager(ctx, settings: Dict[str, Any], seed: int) -> Optional[str]:
    """If eager's output is constant, swap in a copy whose all-zero parameters are re-initialised
    (when that makes the output vary) and say so in ``settings["notes"]``; return the constant
    when the comparisons stay vacuous, else ``None``."""
    import torch

    from layerlab.deploy.vacuous import REINIT_STD, constant_output, describe_params, reinitialised, zero_parameters

    constant = constant_output(ctx.eager_out)
    if constant is None:
        return None
    notes = settings.setdefault("notes", [])
    zeros = zero_parameters(ctx.module)
    if zeros:
        twin = reinitialised(ctx.module, zeros, seed)
        with torch.no_grad(), ctx.seeded():
            twin_out = twin.eval()(*ctx.split()[0], **ctx.split()[1])
        if constant_output(twin_out) is None:
            ctx.module, ctx.eager_out = twin, twin_out
            ctx.__dict__.pop("_eager", None)  # eager runs of the variants use the copy too
            settings["reinitialised"] = zeros
            notes.append(f"the layer's output is constant ({constant}) on the example, so matching it would prove "
                         f"nothing: every path was checked on a copy whose all-zero parameters "
                         f"({describe_params(zeros)}) were re-initialised from N(0, {REINIT_STD}²), seed {seed}")
            return None
        notes.append(f"the layer's output is constant ({constant}); re-initialising its all-zero parameters "
                     f"({describe_params(zeros)}) did not change that")
    else:
        notes.append(f"the layer's output is constant ({constant}) and no parameter is all zeros to re-initialise")
    settings["constant_output"] = constant
    return constant


def _tensors(args) -> list:
    from layerlab.target.bind import flatten

    return [t for a in args for _, t in flatten(a.value)]


def _describe(value: Any) -> Any:
    from layerlab.target.bind import describe

    return describe(value)


def check_target(target, *, paths: Optional[Sequence[str]] = None, compile_backend: str = DEFAULT_COMPILE_BACKEND,
                 rtol: Optional[float] = None, atol: Optional[float] = None,
                 progress: Optional[Progress] = None) -> ExportReport:
    """:func:`export_check` on a :class:`~layerlab.target.Target` (registry name, spec, module + inputs)."""
    return export_check_args(target.module, target.args, paths=paths, compile_backend=compile_backend,
                             rtol=rtol, atol=atol, seed=target.seed, target=target.name,
                             batch_dims=target.batch_dims, tags=target.tags, progress=progress)


def check_all(names: Optional[Sequence[str]] = None, *, paths: Optional[Sequence[str]] = None,
              compile_backend: str = DEFAULT_COMPILE_BACKEND, seed: int = 0,
              progress: Optional[Callable[[str, int, int], None]] = None, device: Any = None) -> ExportMatrix:
    """Every registry layer (or ``names``), on ``device`` (default: where the spec builds it);
    ``progress(name, i, n)`` is called before each."""
    from layerlab.checks.report import Status
    from layerlab.deploy.messages import first_line
    from layerlab.target.build import for_each_entry, from_entry
    from layerlab.target.core import to_device

    selected = select_paths(paths)

    def run(name: str) -> ExportReport:
        target = from_entry(name, seed=seed, reference=False)  # export paths never run the reference
        target.module, target.args = to_device(target.module, target.args, device)
        return check_target(target, paths=selected, compile_backend=compile_backend)

    def unbuildable(name: str, exc: Exception) -> ExportReport:
        reason = f"the layer could not be built: {first_line(exc)}"
        return ExportReport(name, name, [PathResult(p, Status.FAIL, reason) for p in selected])

    reports, seconds = for_each_entry(names, run, unbuildable, progress)
    return ExportMatrix(reports, selected, seconds)

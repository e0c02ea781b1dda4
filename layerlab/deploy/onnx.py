"""The ONNX path: ``torch.onnx.export``, then the model run back through onnxruntime and compared.

An optional extra (``pip install 'layerlab[onnx]'``: onnx, onnxscript, onnxruntime). Without
onnxruntime the cell is ``skip`` and says how to enable it. With onnxscript the exporter is
torch's default one (``dynamo=True``: torch.export, then onnxscript's translation); without it,
the TorchScript-based exporter (``dynamo=False``), whose model is fed to an
``onnxruntime.InferenceSession`` input by input.

The default exporter is given the batch dims as ``Dim("batch")`` and the model is run on the
example and at batch B + 1 (:mod:`layerlab.deploy.onnx_batch`: the exporter falls back to static
shapes without a word when the forward pins the batch); the TorchScript-based one exports static
shapes and is run on the example only. A torch
transformer layer whose eager output under ``no_grad`` differs from onnxruntime's only by its
inference fast path (padded positions 0) passes, and the reason says so. When the exporter raises,
:mod:`layerlab.deploy.onnx_failure` names its step, the op without an ONNX translation and the
user's line.
"""

from __future__ import annotations

import importlib.util
import io
from typing import Any, Dict, List

import torch

from layerlab.target.bind import flatten
from layerlab.checks.report import Status
from layerlab.deploy.context import Context, quiet
from layerlab.deploy.messages import first_line, user_location
from layerlab.deploy.onnx_batch import batch_plan, batched_names, other_batch
from layerlab.deploy.report import PathResult

#: how to get the ONNX column (printed when it is missing)
INSTALL_HINT = "pip install 'layerlab[onnx]'  (onnx, onnxscript, onnxruntime)"


def missing() -> List[str]:
    """The packages the ONNX path needs and cannot import (``onnxscript`` only picks the exporter)."""
    return [name for name in ("onnx", "onnxruntime") if importlib.util.find_spec(name) is None]


def has_onnxscript() -> bool:
    return importlib.util.find_spec("onnxscript") is not None


def onnx(ctx: Context) -> PathResult:
    gone = missing()
    if gone:
        return PathResult("onnx", Status.SKIP, f"{' and '.join(gone)} not installed — {INSTALL_HINT}",
                          hint=INSTALL_HINT, details={"missing": gone})
    dynamo = has_onnxscript()
    exporter = "dynamo (torch.export → onnxscript)" if dynamo else "TorchScript-based (dynamo=False)"
    details: Dict[str, Any] = {"exporter": exporter}
    shapes, B, batch = batch_plan(ctx) if dynamo else (None, 0, None)
    pos, kw = ctx.split()
    with quiet():
        try:
            with torch.no_grad():
                run = _export_dynamo(ctx.fresh(), pos, kw, shapes) if dynamo else _export_legacy(ctx.fresh(), pos, kw)
        except Exception as exc:
            if shapes is None:
                return _export_failed(ctx, exc, dynamo, details)
            try:  # the dynamic batch may be what the exporter cannot take: static shapes alone
                with torch.no_grad():
                    run = _export_dynamo(ctx.fresh(), pos, kw, None)
            except Exception:
                return _export_failed(ctx, exc, dynamo, details)
            details["dynamic_batch_refused"] = first_line(exc)
            shapes = batch = None
        try:
            with ctx.seeded():  # as every run compared with eager
                got = run(pos, kw)
        except Exception as exc:
            return PathResult("onnx", Status.FAIL, f"onnxruntime raised: {first_line(exc)}", rtol=ctx.rtol,
                              atol=ctx.atol, details=dict(details, exception=type(exc).__name__,
                                                          message=str(exc)[:2000]))
    ok, comps, problem = ctx.compare(got, ctx.eager_out, "example")
    if not ok:
        return PathResult("onnx", Status.FAIL, f"onnxruntime's outputs differ from eager: {problem}",
                          matches_eager=False, comparisons=comps, rtol=ctx.rtol, atol=ctx.atol, details=details)
    status, where, hint = Status.PASS, None, None
    if batch is not None:
        details["dynamic_batch"] = batched_names(shapes)
        with quiet():
            warned = other_batch(ctx, run, batch, shapes, B)
        if warned is not None:
            status, reason, where, hint = Status.WARN, warned["reason"], warned["where"], warned["hint"]
        else:
            reason = (f"exported with a dynamic batch; onnxruntime equals eager at batch {B} and {B + 1}"
                      if ctx.variant_eager(batch) is not None else
                      f"exported with a dynamic batch; onnxruntime equals eager at batch {B} (eager raises at {B + 1})")
    elif "dynamic_batch_refused" in details:
        status, hint = Status.WARN, "see the export(dyn B) column for where the batch size is pinned"
        reason = ("exported with static shapes only: with a dynamic batch the exporter raised "
                  f"{details['dynamic_batch_refused']}; onnxruntime equals eager on the example")
    else:
        reason = "exported (static shapes); onnxruntime equals eager on the example"
    if not ctx._compare(got, ctx.eager_out)[0]:  # equal only to eager's autograd-on behaviour
        reason += (" with autograd on; under torch.no_grad() eager takes torch's inference fast path, which "
                   "leaves padded positions 0 where the ONNX model computes them (torch leaves them undefined)")
        details["fast_path_differs"] = True
    return PathResult("onnx", status, reason, where=where, hint=hint, matches_eager=True,
                      comparisons=comps, rtol=ctx.rtol, atol=ctx.atol, details=details)


def _export_failed(ctx: Context, exc: BaseException, dynamo: bool, details: Dict[str, Any]) -> PathResult:
    """A FAIL naming the exporter's step, the op and the user's line where the exception allows
    (:mod:`layerlab.deploy.onnx_failure`); an output torch cannot flatten gets its own hint."""
    from layerlab.deploy.hints import output_hint
    from layerlab.deploy.onnx_failure import diagnose

    def capture():
        pos, kw = ctx.split()
        return torch.export.export(ctx.fresh(), tuple(pos), kwargs=kw or None)

    found = diagnose(exc, ctx.module, ctx.eager_out, capture) if dynamo else None
    if found is not None:
        reason, where, hint = found
    else:
        reason, where = f"torch.onnx.export raised: {first_line(exc)}", user_location(str(exc))
        hint = (output_hint(exc, ctx.eager_out, "onnx")
                or "an op without an ONNX translation, or a graph torch.export cannot capture (see the export column)")
    return PathResult("onnx", Status.FAIL, reason, where=where, rtol=ctx.rtol, atol=ctx.atol, hint=hint,
                      details=dict(details, exception=type(exc).__name__, message=str(exc)[:2000]))


def _export_dynamo(module, pos, kw, dynamic_shapes=None):
    program = torch.onnx.export(module, tuple(pos), kwargs=kw or None, dynamo=True, verbose=False,
                                dynamic_shapes=dynamic_shapes)

    def run(p, k):
        return program(*p, **k)  # ONNXProgram.__call__ runs an onnxruntime InferenceSession

    return run


def _export_legacy(module, pos, kw):
    import onnxruntime as ort

    buf = io.BytesIO()
    torch.onnx.export(module, tuple(pos), buf, kwargs=kw or None, dynamo=False)
    session = ort.InferenceSession(buf.getvalue(), providers=["CPUExecutionProvider"])

    def run(p, k):
        tensors = [t for v in (*p, *k.values()) for _, t in flatten(v)]
        names = [i.name for i in session.get_inputs()]
        feeds = {n: t.detach().cpu().numpy() for n, t in zip(names, tensors)}
        return tuple(torch.from_numpy(o) for o in session.run(None, feeds))

    return run

"""The ONNX model at another batch size: what a deployed model meets first.

``torch.onnx.export(dynamo=True)`` given a ``Dim("batch")`` does not raise when the forward pins
the batch size (``x.view(4, -1)``, a Python loop over the samples): it quietly exports static
shapes, and onnxruntime then refuses any other batch ("Got invalid dimensions for input … Got: 5
Expected: 4"). So the ONNX path exports with the batch dims dynamic and runs the model at batch
B + 1 next to eager; a refused or different batch is a **warn**, with torch.export's own reason
for the pinned batch where it gives one (the line in the user's code).

Only the default (dynamo) exporter is given dynamic shapes; the TorchScript-based one keeps static
shapes and its cell says so.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

from layerlab.deploy.context import Context
from layerlab.deploy.messages import first_line, user_location

#: onnxruntime's words for an input whose fixed size was not met
_FIXED_SIZE = "invalid dimensions for input"


def batch_plan(ctx: Context) -> Tuple[Any, int, Any]:
    """``(dynamic_shapes, B, batch variant)``; ``(None, B, None)`` when there is no batch to vary
    (no batched input, or B < 2: torch.export cannot mark a size below 2 dynamic)."""
    from layerlab.deploy.paths import _batch_shapes

    batch = next((v for v in ctx.variants if v.name == "batch"), None)
    if batch is None:
        return None, 0, None
    shapes, B = _batch_shapes(ctx)
    if B < 2:
        return None, B, None
    return shapes, B, batch


def other_batch(ctx: Context, run: Callable[..., Any], batch: Any, shapes: Any, B: int) -> Optional[dict]:
    """Run the ONNX model at batch B + 1 next to eager. ``None`` when it equals eager there;
    otherwise ``{"reason", "where", "hint"}`` of the warning."""
    from layerlab.deploy.cells import _check_variants

    problems, _, tried = _check_variants(ctx, lambda *p, **k: run(p, k), [batch])
    eager_fails = not tried
    if eager_fails:  # eager cannot run at B + 1 either: still say whether the ONNX model's batch is fixed
        refused = _raises(ctx, run, batch)
        problems = [refused] if refused and _FIXED_SIZE in refused else []
    if not problems:
        return None
    if _FIXED_SIZE not in problems[0]:
        return {"reason": f"dynamic batch exported, but onnxruntime {problems[0]}", "where": None,
                "hint": "the forward treats samples differently at another batch size: see the "
                        "export(dyn B) and trace columns"}
    why, where = _pinned_by(ctx, shapes, B)
    reason = f"the ONNX model only takes batch {B}: the exporter fell back to static shapes"
    if why:
        reason += f" ({why})"
    if eager_fails:
        reason += f"; eager raises at batch {B + 1} too"
    return {"reason": reason, "where": where,
            "hint": "the forward uses the batch size as a Python int: a hard-coded view/reshape "
                    "(view(8, -1): write view(x.shape[0], -1)) or a Python loop over samples"}


def _raises(ctx: Context, run: Callable[..., Any], batch: Any) -> Optional[str]:
    """What the ONNX model raises at the batch variant (``None`` when it runs)."""
    import torch

    pos, kw = ctx.split(batch.args)
    try:
        with torch.no_grad():
            run(pos, kw)
    except Exception as exc:
        return first_line(exc)
    return None


def _pinned_by(ctx: Context, shapes: Any, B: int) -> Tuple[Optional[str], Optional[str]]:
    """torch.export's reason for refusing the dynamic batch, and the line that pinned it."""
    from layerlab.deploy.context import quiet
    from layerlab.deploy.paths import _export
    from layerlab.deploy.pinned import export_pinning

    with quiet():
        raised, where = export_pinning(lambda: _export(ctx, shapes), B)
    if raised is None:
        return None, None
    return first_line(raised), where or user_location(str(raised))


def batched_names(shapes: Any) -> List[str]:
    """The forward arguments given a dynamic batch dim (for the cell's details)."""
    return sorted(name for name, spec in (shapes or {}).items() if spec is not None)

"""Why ``torch.onnx.export`` failed: which of its steps, which op, which line of the user's code.

The dynamo exporter works in three steps and says which one failed ("This is step 1/3"):

1. ``torch.export`` captures the graph. A failure here is the export column's failure (a
   data-dependent branch, an output pytree cannot flatten, ``.numpy()``…) and gets the same hints;
   "an op without an ONNX translation" would send the user the wrong way.
2. The graph is decomposed to core ATen ops.
3. onnxscript translates each op. The usual failure is a ``DispatchError``, "No ONNX function
   found for <OpOverload(op='aten._linalg_eigh', overload='default')>": the op has no ONNX
   translation. The exception names the op but not the user's line; the line is in the captured
   graph's ``stack_trace`` of the node calling that op, so :func:`diagnose` captures the graph once
   more with ``torch.export`` (only on this failure) and reads it from there.

:func:`diagnose` returns ``(reason, where, hint)``, or ``None`` for a failure it cannot place
(the ONNX path then keeps its generic words).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional, Tuple

from layerlab.deploy.messages import first_line, user_location

__all__ = ["diagnose"]

_STEP = re.compile(r"This is step (\d)/3")
_NO_FUNCTION = re.compile(r"No ONNX function found for <OpOverload\(op='([\w.]+)', overload='(\w+)'\)>")
_TRANSLATING = re.compile(r"Error when translating node %\w+ : .*?target=torch\.ops\.([\w.]+)")

#: torch.export's hint when nothing more specific fits (the export column says the same)
EXPORT_HINT = ("data-dependent Python control flow needs torch.cond; .item()/int() on tensors needs torch._check "
               "(torch.onnx.export runs torch.export first: see the export column)")


def diagnose(exc: BaseException, module: Any, eager_out: Any,
             capture: Callable[[], Any]) -> Optional[Tuple[str, Optional[str], str]]:
    """``(reason, where, hint)`` for an exception of ``torch.onnx.export(dynamo=True)``.

    Args:
        exc: what ``torch.onnx.export`` raised.
        module: the layer (to tell a library's own module from the user's code).
        eager_out: eager's outputs (an output type torch cannot flatten gets its own hint).
        capture: runs ``torch.export.export`` on a fresh copy; called only to place a missing op.
    """
    from layerlab.deploy.causes import cause_hint
    from layerlab.deploy.hints import exception_text, output_hint

    text = exception_text(exc)
    step = _STEP.search(text)
    if step is not None and step.group(1) == "1":
        where = user_location(text)
        hint = output_hint(exc, eager_out, "onnx") or cause_hint(exc, "onnx", module, where) or EXPORT_HINT
        return f"torch.export (the exporter's step 1/3) raised: {first_line(exc)}", where, hint
    missing = _NO_FUNCTION.search(text)
    op = f"{missing.group(1)}.{missing.group(2)}" if missing else None
    if op is None:
        translating = _TRANSLATING.search(text)
        if translating is None:
            return None
        op = translating.group(1)
        what = f"translating {op} to ONNX raised: {first_line(exc)}"
    else:
        what = f"no ONNX translation for {op} (onnxscript has no function for it)"
    where = _caller_of(op, capture)
    hint = (f"compute {op.split('.')[1]} outside the exported model, rewrite that step with ops ONNX has, or give the "
            f"exporter a translation: torch.onnx.export(..., custom_translation_table={{torch.ops.{op}: fn}})")
    return what, where, hint


def _caller_of(op: str, capture: Callable[[], Any]) -> Optional[str]:
    """The user's ``file:line`` that calls ``op`` (``aten.sort.stable``), from the captured graph."""
    try:
        program = capture()
    except Exception:
        return None
    packet = op.rsplit(".", 1)[0]  # aten.sort: the overload may differ before decomposition
    for stage in (lambda: program, program.run_decompositions):  # linalg_eigh becomes _linalg_eigh there
        try:
            graph = stage().graph
        except Exception:
            return None
        for node in graph.nodes:
            name = str(getattr(node, "target", ""))
            if node.op == "call_function" and (name == op or name.rsplit(".", 1)[0] == packet):
                where = user_location(node.meta.get("stack_trace") or "")
                if where:
                    return where
    return None

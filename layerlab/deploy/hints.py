"""Hints that depend on what the layer returns: an output torch cannot flatten.

``torch.export`` (and the ONNX exporter built on it) flattens the outputs with
``torch.utils._pytree``; an object of a type it does not know (a Hugging Face ``DynamicCache`` or
``EncoderDecoderCache``: the KV cache a model returns when ``use_cache`` is on) stops the export
with "Found <class …> in output, which is not a known type". Saying "data-dependent control flow
needs torch.cond" there sends the user the wrong way: the fix is not to return the object
(``use_cache=False``) or to register its type as a pytree. ``torch.jit.trace`` is stricter still:
only tensors and tuples/lists/dicts of them.

:func:`unflattenable_outputs` walks eager's output with pytree itself (the same flattening export
does); :func:`output_hint` turns that and the exception text into a hint, or ``None`` when the
failure is about something else.
"""

from __future__ import annotations

import re
from typing import Any, List, Optional, Tuple

__all__ = ["unflattenable_outputs", "output_hint", "exception_text"]

#: leaves pytree may keep as they are (everything else is an object export cannot flatten)
_PLAIN = (int, float, bool, complex, str, bytes, type(None))

#: torch's words for "an output I cannot flatten" (torch.export / the ONNX exporter, jit.trace);
#: a bare "pytree" or "not a known type" counts only next to the name of a type eager returned
#: (export also says "pytree" about inputs and dynamic_shapes)
_OUTPUT_TEXT = re.compile(r"in output, which is not a known type|unsupported output type", re.IGNORECASE)
_PYTREE_TEXT = re.compile(r"not a known type|pytree", re.IGNORECASE)
_TRACE_TEXT = re.compile(r"Tracer cannot infer type of|can be output from traced functions|"
                         r"Encountering a dict at the output of the tracer")


def unflattenable_outputs(out: Any) -> List[Tuple[str, type]]:
    """``[(where, type)]`` of the objects in ``out`` that pytree leaves unflattened and that are not
    tensors or plain Python values (``where`` is pytree's key path, ``"output"`` for the whole)."""
    import torch
    import torch.utils._pytree as pytree

    try:
        leaves = pytree.tree_flatten_with_path(out)[0]
    except Exception:  # an output pytree itself chokes on: report the whole thing
        return [("output", type(out))]
    found = []
    for path, leaf in leaves:
        if isinstance(leaf, (torch.Tensor, *_PLAIN)) or leaf is Ellipsis:
            continue
        found.append((pytree.keystr(path) or "output", type(leaf)))
    return found


def exception_text(exc: BaseException) -> str:
    """The exception's message and those of its causes (the ONNX exporter wraps export's)."""
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _is_cache(cls: type) -> bool:
    return "cache" in cls.__name__.lower()


def output_hint(exc: BaseException, eager_out: Any, path: str) -> Optional[str]:
    """The fix when ``exc`` is about the layer's output type, else ``None``.

    Args:
        exc: what the path raised.
        eager_out: the layer's eager output on the example.
        path: the export path (``trace`` has its own, stricter rule).
    """
    text = exception_text(exc)
    odd = unflattenable_outputs(eager_out)
    named = [(where, cls) for where, cls in odd if cls.__name__ in text]
    culprit = (named or odd or [None])[0]
    cache = culprit is not None and _is_cache(culprit[1])
    no_cache = ("pass use_cache=False (a forward keyword argument, or config.use_cache = False): "
                "the KV cache is for generation, not for an exported forward") if cache else None
    if path == "trace":
        if not _TRACE_TEXT.search(text):
            return None
        fix = "return a tuple of tensors (Hugging Face models: pass return_dict=False, and use_cache=False)"
        if no_cache:
            return f"{no_cache}; and {fix}"
        if "Encountering a dict" in text:  # a dict (a Hugging Face ModelOutput) under strict tracing
            return (f"torch.jit.trace (strict) refuses dict outputs: {fix}, or trace with strict=False "
                    f"(torch.jit.trace(model, example, strict=False) keeps the dict), or use torch.export")
        return f"torch.jit.trace returns only tensors and tuples/lists/dicts of them: {fix}, or use torch.export"
    if not (_OUTPUT_TEXT.search(text) or (named and _PYTREE_TEXT.search(text))):
        return None
    if culprit is None:
        return ("an output torch.export cannot flatten: return tensors (or tuples/lists/dicts of them), or "
                "register its type with torch.utils._pytree.register_pytree_node")
    where, cls = culprit
    what = (f"the output is a {_qualname(cls)}" if where == "output" else f"the output {where} is a {_qualname(cls)}")
    what += ", a type torch.export cannot flatten"
    if cache:
        return f"{what}: {no_cache}; or register the type with torch.utils._pytree.register_pytree_node"
    return (f"{what}: return its tensors instead, or register the type with "
            "torch.utils._pytree.register_pytree_node")

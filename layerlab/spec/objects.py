"""Constructor arguments that are objects, and calling the user's constructors and factories.

An argument written as a mapping with a ``class:`` key is built before the call that takes it::

    layer: transformers:GPT2Model
    args:
      config: {class: transformers:GPT2Config, args: {n_layer: 2, n_embd: 32, n_head: 2}}

``class:`` names a class or any callable (resolved like a layer name: import paths need
``--allow-import``, except the model and config classes, vetted factories and ``torch.nn.functional``
functions that :mod:`layerlab.spec.allowlist` accepts — an argument is data, and a class-valued one
follows the same rule as the layer); its ``args:`` (a mapping, a list or
one value) are checked against its signature as a layer's are, and may hold objects again (built
innermost first). Any other mapping is passed as a plain ``dict``. Objects are built each time the
model is, under the spec's seed (and on the meta device for a meta build).

:func:`call` runs a constructor or factory and turns its failure into a :class:`SpecError` at the
spec's line: a missing module (``ModuleNotFoundError`` inside the user's ``__init__``) is named as
such with the ``file:line`` of the failed import; anything else is "rejected its arguments".
"""

from __future__ import annotations

import traceback
from typing import Any, Dict, List, Optional

from layerlab.errors import SpecError
from layerlab.spec import limits
from layerlab.spec.load import Marks
from layerlab.spec.schema import OBJECT_KEYS, LayerNode, ObjectArg, check_keys, type_error


def parse_objects(value: Any, marks: Marks, path: tuple, *, allow_import: bool, base_dir: Optional[str]) -> Any:
    """``value`` with every ``{class: …}`` mapping in it replaced by a checked :class:`ObjectArg`."""
    from layerlab.spec.args import check_args
    from layerlab.spec.resolve import resolve_callable

    def walk(v: Any, at: tuple) -> Any:
        if isinstance(v, dict) and "class" in v:
            check_keys(v, OBJECT_KEYS, marks, at, "an object argument {class: …, args: …}")
            name = v["class"]
            where = marks(*at, "class")
            if not isinstance(name, str) or not name.strip():
                raise type_error("class", name, "a class or callable name (transformers:GPT2Config)", where)
            resolved = resolve_callable(name, where=where, allow_import=allow_import, base_dir=base_dir)
            args = v.get("args")
            args_path = at + ("args",)
            positional: List[Any] = []
            keyword: Dict[str, Any] = {}
            if isinstance(args, dict):
                keyword = {k: walk(a, args_path + (k,)) for k, a in args.items()}
            elif isinstance(args, list):
                positional = [walk(a, args_path + (i,)) for i, a in enumerate(args)]
            elif args is not None:
                positional = [walk(args, args_path)]
            node = LayerNode(name=name.strip(), args=positional, kwargs=keyword, where=where, path=args_path)
            check_args(node, resolved.cls, marks, resolved.name)
            return ObjectArg(name=resolved.name, resolved=resolved, args=positional, kwargs=keyword, where=where)
        if isinstance(v, dict):
            return {k: walk(a, at + (k,)) for k, a in v.items()}
        if isinstance(v, list):
            return [walk(a, at + (i,)) for i, a in enumerate(v)]
        return v

    return walk(value, path)


def build_value(value: Any) -> Any:
    """Build every :class:`ObjectArg` in ``value`` (innermost first); other values as they are."""
    if isinstance(value, ObjectArg):
        return call(value.resolved.cls, [build_value(a) for a in value.args],
                    {k: build_value(a) for k, a in value.kwargs.items()}, value.name, value.where)
    if isinstance(value, dict):
        return {k: build_value(a) for k, a in value.items()}
    if isinstance(value, list):
        return [build_value(a) for a in value]
    return value


def call(fn: Any, args: List[Any], kwargs: Dict[str, Any], display: str, where: str) -> Any:
    """``fn(*args, **kwargs)``; its failure is the spec's :class:`SpecError` at ``where``."""
    try:
        return fn(*args, **kwargs)
    except ImportError as exc:  # the user's code imports what this machine lacks: not an argument problem
        missing = exc.name or limits.first_line(exc)
        raise SpecError(
            f"{display}(…) failed importing {missing!r} at {import_site(exc)}: {type(exc).__name__}: "
            f"{limits.first_line(exc)}", where=where, expected=None, got=missing,
            hint=f"install {missing.split('.')[0]!r} in this environment (or fix that import); the arguments "
                 "were not the problem",
        ) from None
    except Exception as exc:  # the constructor judged the arguments: the spec's problem
        raise SpecError(
            f"{display}(…) rejected its arguments: {limits.first_line(exc)}", where=where,
            expected=None, got={**{str(i): _shown(a) for i, a in enumerate(args)},
                                **{k: _shown(a) for k, a in kwargs.items()}},
            hint="fix the arguments under this layer",
        ) from None


def import_site(exc: BaseException) -> str:
    """``file:line`` of the innermost frame outside importlib's machinery (the failed ``import``)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen")]
    if not frames:
        return "?"
    return f"{frames[-1].filename}:{frames[-1].lineno}"


def _shown(value: Any) -> Any:
    """A built object echoed by its class name (a config's repr runs to pages)."""
    if isinstance(value, (bool, int, float, str, type(None), list, tuple, dict)):
        return value
    return f"<{type(value).__name__}>"


__all__ = ["build_value", "call", "import_site", "parse_objects"]

"""Inputs bound to ``forward``: named arguments, passed by position or keyword, and the tensor walk.

Every command runs a module on the same :class:`Arg` list: a name (``forward``'s parameter name, or
``input{i}`` past its signature), a value (a tensor, a nested tuple/list/dict of them, or a plain
value), and whether it is passed by keyword. :func:`bind` makes that list from ``*inputs, **kwargs``
as a Python caller writes them; a spec builds it from ``inputs:`` (:mod:`layerlab.target.build`).

Nested values are walked by :func:`flatten` and :func:`map_tensors`, which give every tensor a path
(``hx[1]``, ``output['h']``) and keep one tensor passed twice (``key is query``) one tensor.
"""

from __future__ import annotations

import inspect as pyinspect
from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from torch import Tensor, nn

__all__ = ["Arg", "bind", "call", "forward_params", "accepts", "positional_names", "map_tensors", "map_args",
           "flatten", "input_tensors", "describe", "class_path"]


@dataclass
class Arg:
    """One forward argument: its name, its value, and whether it is passed by keyword.

    ``no_grad`` holds the paths (``target``, ``hx[1]``) of floating tensors gradients must not flow
    to; ``None`` until the checks decide (:func:`layerlab.checks.case.grad_selection`)."""

    name: str
    value: Any
    keyword: bool = False
    no_grad: Optional[FrozenSet[str]] = None


def bind(module: nn.Module, inputs: Sequence[Any], kwargs: Optional[Mapping[str, Any]] = None) -> List[Arg]:
    """``module(*inputs, **kwargs)`` as :class:`Arg`\\ s: positional inputs named after ``forward``'s
    parameters (``input{i}`` past them), keyword ones by their own names."""
    names = positional_names(module, len(inputs))
    args = [Arg(n, v, False) for n, v in zip(names, inputs)]
    return args + [Arg(n, v, True) for n, v in (kwargs or {}).items()]


def call(fn: Callable, args: Sequence[Arg]) -> Any:
    """``fn(*positional, **keyword)`` with ``args`` split by how each is passed."""
    pos = [a.value for a in args if not a.keyword]
    kw = {a.name: a.value for a in args if a.keyword}
    return fn(*pos, **kw)


def forward_params(module: Any) -> Dict[str, pyinspect.Parameter]:
    """The parameters of ``module.forward`` (of ``module`` itself for a plain callable) by name
    (empty if the signature is unreadable)."""
    try:
        return dict(pyinspect.signature(getattr(module, "forward", module)).parameters)
    except (TypeError, ValueError):
        return {}


def accepts(module: Any, name: str) -> bool:
    params = forward_params(module)
    return name in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


def positional_names(module: Any, n: int) -> List[str]:
    """Names for ``n`` positional inputs: ``forward``'s parameter names, then ``input{i}``."""
    params = [p.name for p in forward_params(module).values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [params[i] if i < len(params) else f"input{i}" for i in range(n)]


def map_tensors(value: Any, fn: Callable[[Tensor], Any], memo: Optional[dict] = None) -> Any:
    """Apply ``fn`` to every tensor in a nested tuple/list/dict/dataclass; one tensor passed twice (``key is
    query``) maps to one result, so shared inputs stay shared."""
    memo = {} if memo is None else memo
    if isinstance(value, Tensor):
        if id(value) not in memo:
            memo[id(value)] = fn(value)
        return memo[id(value)]
    if isinstance(value, tuple):
        return tuple(map_tensors(v, fn, memo) for v in value)
    if isinstance(value, list):
        return [map_tensors(v, fn, memo) for v in value]
    if isinstance(value, dict):
        return {k: map_tensors(v, fn, memo) for k, v in value.items()}
    if is_dataclass_instance(value):
        import copy

        twin = copy.copy(value)
        for name in field_names(value):
            object.__setattr__(twin, name, map_tensors(getattr(value, name), fn, memo))  # frozen ones too
        return twin
    return value


def map_args(args: Sequence[Arg], fn: Callable[[Tensor], Any]) -> List[Arg]:
    memo: dict = {}
    return [Arg(a.name, map_tensors(a.value, fn, memo), a.keyword, a.no_grad) for a in args]


def flatten(value: Any, prefix: str = "output") -> List[Tuple[str, Tensor]]:
    """``[(path, tensor)]`` of every tensor in a nested value: ``output``, ``output[1][0]``, ``output['h']``,
    ``output.logits`` (a dataclass's field). A generator is refused (:func:`refuse_lazy`)."""
    if isinstance(value, Tensor):
        return [(prefix, value)]
    out: List[Tuple[str, Tensor]] = []
    if isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            out.extend(flatten(v, f"{prefix}[{i}]"))
    elif isinstance(value, dict):
        for k, v in value.items():
            out.extend(flatten(v, f"{prefix}[{k!r}]"))
    elif is_dataclass_instance(value):
        for name in field_names(value):
            out.extend(flatten(getattr(value, name), f"{prefix}.{name}"))
    else:
        refuse_lazy(value, prefix)
    return out


def is_dataclass_instance(value: Any) -> bool:
    """A dataclass object (not the class): its fields are walked like a dict's values."""
    return hasattr(type(value), "__dataclass_fields__") and not isinstance(value, type)


def field_names(value: Any) -> List[str]:
    import dataclasses

    return [f.name for f in dataclasses.fields(value) if hasattr(value, f.name)]


def refuse_lazy(value: Any, where: str) -> None:
    """A generator (or another one-shot iterator) where tensors are expected is a clear error: its
    values exist only while it is iterated, once, so no check can read them (and reading them would
    use them up for the caller)."""
    import collections.abc

    if isinstance(value, collections.abc.Iterator) and not isinstance(value, (Tensor, str, bytes)):
        from layerlab.errors import UsageError

        what = "the model's output" if where in ("output", "") else where
        raise UsageError(f"{what} is a {type(value).__name__}: its values are made only while it is iterated, "
                         "once, so layerlab cannot check them", where=where,
                         expected="tensors, or tuples, lists, dicts or dataclasses of them",
                         got=type(value).__name__,
                         hint="return a tuple or list instead: return tuple(... for ...)")


def input_tensors(args: Sequence[Arg]) -> List[Tuple[str, Tensor]]:
    """``[(path, tensor)]`` of every input tensor, in argument order."""
    return [pt for a in args for pt in flatten(a.value, a.name)]


def describe(value: Any) -> Any:
    """An input as a report shows it: ``float32[2, 3, 8]`` for a tensor, a list for a tuple/list,
    plain values as they are (others by ``repr``)."""
    if isinstance(value, Tensor):
        return f"{str(value.dtype).replace('torch.', '')}{list(value.shape)}"
    if isinstance(value, (tuple, list)):
        return [describe(v) for v in value]
    return repr(value) if not isinstance(value, (bool, int, float, str, type(None))) else value


def class_path(obj: Any) -> str:
    """What a report calls a module or reference: ``torch.nn.LSTM``, ``my_pkg.layers.MyLSTM``, a
    function's qualified name."""
    cls = obj if isinstance(obj, type) else type(obj)
    if cls.__module__.startswith("torch.nn.modules"):
        return f"torch.nn.{cls.__qualname__}"
    if not isinstance(obj, (type, nn.Module)) and callable(obj):
        return getattr(obj, "__qualname__", None) or repr(obj)
    return f"{cls.__module__}.{cls.__qualname__}"

"""Constructor arguments of a spec layer, checked against the class's signature before building.

Unknown names get a did-you-mean over the real parameter names; missing required arguments are
named; values are checked against the annotations where those are plain (``int``, ``float``,
``bool``, ``str``, ``None``, tuples and unions of them — torch's ``_size_2_t`` is
``Union[int, Tuple[int, int]]``); anything else is left for the constructor to judge.
"""

from __future__ import annotations

import inspect as pyinspect
import typing
from typing import Any, Dict, List, Optional, Tuple

from layerlab.errors import SpecError
from layerlab.spec.load import Marks
from layerlab.spec.schema import LayerNode, ObjectArg, did_you_mean

_POSITIONAL = (pyinspect.Parameter.POSITIONAL_ONLY, pyinspect.Parameter.POSITIONAL_OR_KEYWORD)
_NAMED = (pyinspect.Parameter.POSITIONAL_OR_KEYWORD, pyinspect.Parameter.KEYWORD_ONLY)


def _rnn_params(cls: type, params: List[pyinspect.Parameter]):
    """torch's RNN/LSTM/GRU take ``*args, **kwargs`` and pass them on to ``RNNBase(mode, …)``."""
    import torch.nn as nn

    if not (issubclass(cls, nn.RNNBase) and [p.kind for p in params] == [
        pyinspect.Parameter.VAR_POSITIONAL, pyinspect.Parameter.VAR_KEYWORD
    ]):
        return None
    base = list(pyinspect.signature(nn.RNNBase.__init__).parameters.values())[2:]  # self, mode
    if issubclass(cls, nn.RNN):
        extra = pyinspect.Parameter("nonlinearity", pyinspect.Parameter.KEYWORD_ONLY, default="tanh")
        base.append(extra)
    if not issubclass(cls, nn.LSTM):
        base = [p for p in base if p.name != "proj_size"]
    return base, nn.RNNBase.__init__


def init_signature(cls: type) -> Tuple[List[pyinspect.Parameter], Dict[str, Any]]:
    """The parameters of ``cls.__init__`` (without ``self``) and their resolvable annotations.

    ``cls`` may also be a factory (a function, a bound classmethod): its own parameters.
    """
    if not isinstance(cls, type):
        try:
            params = list(pyinspect.signature(cls).parameters.values())
        except (TypeError, ValueError):
            return [], {}
        try:
            hints = typing.get_type_hints(cls)
        except Exception:
            hints = {}
        return params, hints
    try:
        sig = pyinspect.signature(cls.__init__)
    except (TypeError, ValueError):
        return [], {}
    params = list(sig.parameters.values())[1:]
    init = cls.__init__
    rnn = _rnn_params(cls, params)
    if rnn is not None:
        params, init = rnn
    try:
        hints = typing.get_type_hints(init)
    except Exception:  # unresolvable string annotations: check names only
        hints = {}
    return params, hints


def _union_args(ann: Any) -> Optional[tuple]:
    origin = typing.get_origin(ann)
    if origin is typing.Union or type(ann).__name__ == "UnionType":
        return typing.get_args(ann)
    return None


def matches(value: Any, ann: Any) -> Optional[bool]:
    """Does ``value`` fit the annotation? ``None`` when the annotation is not a plain one."""
    if isinstance(value, ObjectArg):
        return None  # built later: its constructor's result is for the callee to judge
    if ann is typing.Any or ann is pyinspect.Parameter.empty:
        return None
    members = _union_args(ann)
    if members is not None:
        results = [matches(value, m) for m in members]
        if any(r is True for r in results):
            return True
        return None if any(r is None for r in results) else False
    if ann is type(None):
        return value is None
    if typing.get_origin(ann) is typing.Literal:
        return value in typing.get_args(ann)
    if ann is bool:
        return isinstance(value, bool)
    if ann is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if ann is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if ann is str:
        return isinstance(value, str)
    origin = typing.get_origin(ann) or ann
    if origin in (tuple, list) or origin in (typing.Sequence,):
        if not isinstance(value, (list, tuple)):
            return False
        elems = typing.get_args(ann)
        if not elems:
            return True
        if origin is tuple and not (len(elems) == 2 and elems[1] is Ellipsis):
            if len(elems) != len(value):
                return False
            results = [matches(v, e) for v, e in zip(value, elems)]
        else:
            results = [matches(v, elems[0]) for v in value]
        if all(r is True for r in results):
            return True
        return False if any(r is False for r in results) else None
    return None


def describe(ann: Any) -> str:
    """``int or (int, int)``: an annotation in words."""
    members = _union_args(ann)
    if members is not None:
        return " or ".join(describe(m) for m in members)
    if ann is type(None):
        return "null"
    if typing.get_origin(ann) is typing.Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(ann)))
    origin = typing.get_origin(ann)
    if origin in (tuple, list):
        elems = typing.get_args(ann)
        if len(elems) == 2 and elems[1] is Ellipsis:
            return f"a list of {describe(elems[0])}"
        return "[" + ", ".join(describe(e) for e in elems) + "]" if elems else "a list"
    return getattr(ann, "__name__", str(ann).replace("typing.", ""))


def _hf_config_attributes(cls: Any) -> Optional[List[str]]:
    """A Hugging Face config's attributes, read from a default instance; ``None`` for another class.

    Its signature lists the architecture's own arguments only, yet it takes every common one too
    (``num_labels``, ``id2label``, ``output_attentions`` …: transformers 5 hides the ``**kwargs`` its 4.x
    signatures showed) and silently keeps any other keyword as an attribute, a typo included. So a
    keyword is accepted when a default config has that attribute, and refused (with a did-you-mean)
    otherwise; a config that cannot be built with its defaults takes any keyword, as HF does."""
    if not (isinstance(cls, type) and any(
            base.__name__ in ("PretrainedConfig", "PreTrainedConfig") and base.__module__.startswith("transformers.")
            for base in cls.__mro__)):
        return None
    try:
        default = cls()
    except Exception:
        return []
    return [name for name in dir(default)  # its values: not its methods (to_dict, save_pretrained, …)
            if not name.startswith("_") and not callable(getattr(type(default), name, None))]


def check_args(node: LayerNode, cls: type, marks: Marks, display: str) -> None:
    """Raise :class:`SpecError` for unknown, missing, surplus or ill-typed constructor arguments."""
    params, hints = init_signature(cls)
    if not params and not hints:
        return
    var_kw = any(p.kind is pyinspect.Parameter.VAR_KEYWORD for p in params)
    config_attributes = _hf_config_attributes(cls)
    if config_attributes is not None:
        var_kw = not config_attributes  # (built with its defaults it failed: any keyword, as HF takes)
        named = [p.name for p in params if p.kind in _NAMED]
        params = [*params, *(pyinspect.Parameter(n, pyinspect.Parameter.KEYWORD_ONLY, default=None)
                             for n in config_attributes if n not in named)]
    var_pos = any(p.kind is pyinspect.Parameter.VAR_POSITIONAL for p in params)
    named = [p.name for p in params if p.kind in _NAMED]
    positional = [p.name for p in params if p.kind in _POSITIONAL]
    for key in node.kwargs:
        if not isinstance(key, str):
            raise SpecError(f"argument names must be strings, got {key!r}", where=marks(*node.path, key))
        if key not in named and not var_kw:
            raise SpecError(
                f"{display} has no argument {key!r}", where=marks(*node.path, key),
                expected="one of " + ", ".join(n for n in named if n not in ("device", "dtype")),
                got=key, hint=did_you_mean(key, named),
            )
    if len(node.args) > len(positional) and not var_pos:
        raise SpecError(
            f"{display} takes at most {len(positional)} positional arguments, got {len(node.args)}",
            where=marks(*node.path), expected=positional, got=node.args,
            hint="name the arguments (in_channels: 3, …) to be sure which is which",
        )
    given = dict(zip(positional, node.args))
    for key, value in node.kwargs.items():
        if key in given:
            raise SpecError(f"{display} got {key!r} both by position and by name", where=marks(*node.path, key))
        given[key] = value
    missing = [
        p.name for p in params
        if p.default is pyinspect.Parameter.empty and p.kind in _NAMED + _POSITIONAL[:1] and p.name not in given
    ]
    if missing:
        raise SpecError(
            f"{display} needs argument {missing[0]!r}" + (f" (and {', '.join(missing[1:])})" if missing[1:] else ""),
            where=node.where, expected=missing, got=sorted(given),
            hint=f"add `{missing[0]}: …` under its arguments",
        )
    for i, (key, value) in enumerate(given.items()):
        ann = hints.get(key)
        if ann is None or isinstance(value, ObjectArg) or matches(value, ann) is not False:
            continue
        where = marks(*node.path, key) if key in node.kwargs else marks(*node.path, i)
        raise SpecError(
            f"{display} argument {key} must be {describe(ann)}, got {type(value).__name__} {value!r}",
            where=where, expected=describe(ann), got=value,
            hint="YAML reads 3 as a number and '3' or \"3\" as a string" if isinstance(value, str) else None,
        )

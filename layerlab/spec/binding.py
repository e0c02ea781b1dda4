"""Binding a spec's inputs to ``forward``'s parameters (by name, then by position).

See :func:`bind`. Moved out of :mod:`layerlab.spec.inputs`, which re-exports it.
"""

from __future__ import annotations

import difflib
import inspect as pyinspect
from typing import Dict, List, Optional, Tuple

from layerlab.errors import SpecError
from layerlab.spec.schema import did_you_mean


def forward_params(cls: type) -> Tuple[List[pyinspect.Parameter], bool]:
    """``forward``'s parameters (without ``self``) and whether it takes ``*args``."""
    try:
        params = list(pyinspect.signature(cls.forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return [], True
    return params, any(p.kind is pyinspect.Parameter.VAR_POSITIONAL for p in params)


def bind(cls: type, names: List[str], where: str, display: str,
         where_of: Optional[Dict[str, str]] = None) -> Tuple[List[str], Dict[str, str]]:
    """Match input names to ``cls.forward``'s parameters.

    A name that is a parameter is passed by that name; the other inputs, in the order written,
    take the parameters no input named, in ``forward``'s order (then ``*args``). Returns the
    positional input names and ``{parameter: input name}`` for the keyword ones. Raises
    :class:`SpecError` for an input ``forward`` cannot take, a required parameter left empty, and
    an input whose name is a near-miss of another parameter than the one its position gives it
    (``atn_mask`` would silently become ``key_padding_mask``). ``where_of`` places that error at
    the input's own line.
    """
    params, var_pos = forward_params(cls)
    P = pyinspect.Parameter
    signature = _signature_text(params)
    named = {p.name for p in params if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)}
    keyword = {n: n for n in names if n in named}
    positional: List[str] = []
    unnamed = [n for n in names if n not in named]
    # Unnamed inputs fill forward's free parameters in order. They go by position while no
    # named input sits before them (so a reference whose forward names its parameters
    # differently takes them too); after such a gap, by the parameter's name.
    gap = False
    by_position = set()
    bound_to: Dict[str, str] = {}
    for param in (p for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)):
        if param.name in keyword:
            gap = True
            continue
        if not unnamed:
            break
        name = unnamed.pop(0)
        bound_to[name] = param.name
        if gap and param.kind is not P.POSITIONAL_ONLY:
            keyword[param.name] = name
        else:
            positional.append(name)
            by_position.add(param.name)
    for name in unnamed:
        if var_pos and not gap:
            positional.append(name)
            bound_to[name] = "*" + next(p.name for p in params if p.kind is P.VAR_POSITIONAL)
        else:
            raise SpecError(
                f"{display}.forward{signature} takes no input named {name!r}", where=where,
                expected=[p.name for p in params], got=names,
                hint=did_you_mean(name, [p.name for p in params]) or "name inputs after forward's parameters",
            )
    for name, param_name in bound_to.items():
        _check_near_miss(name, param_name, [p.name for p in params], (where_of or {}).get(name, where),
                         display, signature)
    filled = set(keyword) | by_position
    missing = [p.name for p in params if p.default is P.empty and p.name not in filled
               and p.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD)]
    if missing:
        raise SpecError(
            f"missing input {missing[0]!r} for {display}.forward{signature}", where=where,
            expected=[p.name for p in params if p.default is P.empty], got=names,
            hint=f"add it under inputs:, e.g. {missing[0]}: {{shape: […]}} (or same_as: another input)",
        )
    return positional, keyword


def _check_near_miss(name: str, bound: str, params: List[str], where: str, display: str, signature: str) -> None:
    """An input bound by position whose name looks like a typo of *another* parameter is refused."""
    if difflib.SequenceMatcher(None, name, bound.lstrip("*")).ratio() >= _NEAR:
        return
    close = difflib.get_close_matches(name, [p for p in params if p != bound], n=1, cutoff=_NEAR)
    if close:
        raise SpecError(
            f"input {name!r} is not a parameter of {display}.forward{signature}; by position it would be "
            f"passed as {bound!r}", where=where, expected=params, got=name,
            hint=f"did you mean {close[0]!r}? (name the input after the parameter it is for)",
        )


#: how alike an input name and a parameter name must be to count as a typo (atn_mask ~ attn_mask: 0.94)
_NEAR = 0.75


def _signature_text(params: List[pyinspect.Parameter]) -> str:
    shown = [p.name if p.default is pyinspect.Parameter.empty else f"{p.name}=…" for p in params[:6]]
    return "(" + ", ".join(shown) + (", …" if len(params) > 6 else "") + ")"

"""Is a report read back from JSON shaped the way ``layerlab diff`` reads it?

A ``--json`` file is user input: it may be cut, hand-edited, or not a report at all. Before any
comparison, the parts the comparators index into are checked here — ``calls`` is a list of
objects, each with a string ``path`` and a whole-number ``call``, a tensor's ``shape`` is a list of
whole numbers, names are plain values, every number the comparators compare (statistics, norms,
FLOPs, bytes, times) is a number (or ``"nan"``/``"inf"``/``"-inf"``, how a report writes the
non-finite ones), ``kind`` is a string — and the first thing out of shape is a
:class:`~layerlab.report_diff.load.ReportError` (exit 2) naming its JSON path
(``A.json: calls[3].outputs[0].stats.mean``), what was expected and what is there: a hand-edited
``"mean": "abc"`` is never compared as "equal" text. Messages and other free text are not checked.
Nesting deeper than :data:`MAX_DEPTH` is refused before any recursive walk.

Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Tuple

__all__ = ["check", "MAX_DEPTH"]

#: layerlab's reports nest about 6 levels deep (calls[i].outputs[j].stats.mean); far more is not one
MAX_DEPTH = 64


@dataclass(frozen=True)
class Shape:
    """What one value must look like: ``test`` on the value; ``items`` for a list's elements,
    ``fields`` for an object's keys (``required`` ones must be there); ``None`` allowed unless
    ``nullable`` is False."""

    what: str
    test: Callable[[Any], bool]
    items: Optional["Shape"] = None
    fields: Dict[str, "Shape"] = field(default_factory=dict)
    required: Tuple[str, ...] = ()
    nullable: bool = True


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_scalar(v: Any) -> bool:  # usable as a key to match rows by
    return v is None or isinstance(v, (str, int, float, bool))


def _is_number(v: Any) -> bool:  # non-finite values are written as strings (layerlab.serialize)
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) or v in ("nan", "inf", "-inf")


STR = Shape("a string", lambda v: isinstance(v, str))
NUMBER = Shape('a number (or "nan", "inf", "-inf")', _is_number)
BOOL = Shape("true or false", lambda v: isinstance(v, bool))
INT = Shape("a whole number", _is_int)
SCALAR = Shape("a string or a number", _is_scalar)
OBJECT = Shape("an object", lambda v: isinstance(v, dict))


def list_of(item: Shape) -> Shape:
    return Shape(f"a list of {item.what.removeprefix('a ').removeprefix('an ')}s", lambda v: isinstance(v, list),
                 items=item)


def record(required: Tuple[str, ...] = (), **fields: Shape) -> Shape:
    return Shape("an object", lambda v: isinstance(v, dict), fields=fields, required=required)


def _needed(shape: Shape) -> Shape:
    return Shape(shape.what, shape.test, shape.items, shape.fields, shape.required, nullable=False)


STATS = record(mean=NUMBER, std=NUMBER, min=NUMBER, max=NUMBER, zeros=NUMBER, nan=NUMBER, inf=NUMBER, numel=NUMBER)
TENSOR = record(name=STR, shape=list_of(_needed(INT)), stats=STATS, grad=record(norm=NUMBER, nan=BOOL, inf=BOOL),
                slot=INT)
PARAM = record(("name",), name=_needed(SCALAR), flags=list_of(_needed(STR)), numel=NUMBER, norm=NUMBER,
               grad_norm=NUMBER, ratio=NUMBER)
COST = dict(forward_s=NUMBER, backward_s=NUMBER, flops_forward=NUMBER, flops_backward=NUMBER,
            activation_bytes=NUMBER, output_bytes=NUMBER, param_bytes=NUMBER)
CALL = record(("path", "call", "class_name", "index"), path=_needed(STR), call=_needed(INT),
              class_name=_needed(SCALAR), index=_needed(INT), parent=INT, inputs=list_of(TENSOR),
              outputs=list_of(TENSOR))
FINDING = record(severity=SCALAR, code=SCALAR, where=SCALAR)
PROBE_ROW = record(path=SCALAR, call=SCALAR, values=OBJECT, series=OBJECT, flags=list_of(_needed(STR)))
PROBE = record(name=SCALAR, rows=list_of(PROBE_ROW), summary=OBJECT)
CHECKS = list_of(record(name=SCALAR))

#: per report kind, the top-level keys the comparators read and their shapes
SHAPES: Dict[str, Shape] = {
    "inspect-report": record(
        calls=list_of(_needed(CALL)), inputs=list_of(TENSOR), failure=OBJECT,
        backward=record(loss_value=NUMBER, output_grad_norm=NUMBER), params=list_of(_needed(PARAM)),
        problems=list_of(_needed(FINDING)), notes=list_of(_needed(FINDING)),
        checks=list_of(_needed(record(("path",), path=_needed(SCALAR)))), probes=list_of(_needed(PROBE)),
    ),
    "gradcheck-report": record(checks=CHECKS),
    "gradcheck-matrix": record(reports=list_of(_needed(record(target=SCALAR, checks=CHECKS)))),
    "profile-report": record(totals=record(**COST), rows=list_of(_needed(record(path=SCALAR, call=SCALAR, **COST)))),
}


def check(report: Dict[str, Any], kind: str, name: str) -> None:
    """Raise a ReportError at the first part of ``report`` (a ``kind``) diff cannot read."""
    _depth(report, name)
    if "kind" in report and not isinstance(report["kind"], str):
        _fail(name, "kind", 'a string naming the report kind ("inspect-report", "profile-report", …)',
              report["kind"])
    shape = SHAPES.get(kind)
    if shape is not None:
        _walk(report, shape, name, kind.replace("-", " "))


def _fail(name: str, at: str, expected: str, got: Any, kind: str = "") -> None:
    from layerlab.report_diff.load import ReportError
    from layerlab.spec.limits import clean_text

    where = f"{name}: {at}" if at else name
    shown = "nothing (the key is missing)" if got is _MISSING else \
        f"{_json_type(got)} {clean_text(repr(got), 60)}"
    raise ReportError(f"{name} is not a well-formed {kind or 'report'}: {at or 'the document'} should be {expected}",
                      where=where, expected=expected, got=shown,
                      hint="was the file edited or cut short? Make it again with the command's --json")


_MISSING = object()


def _json_type(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), "a number" if isinstance(v, (int, float)) else type(v).__name__)


def _walk(value: Any, shape: Shape, name: str, kind: str) -> None:
    # iterative, so a long list costs no stack
    stack = [(value, shape, "")]
    while stack:
        v, s, here = stack.pop()
        if v is None:
            if not s.nullable:
                _fail(name, here, s.what, v, kind)
            continue
        if not s.test(v):
            _fail(name, here, s.what, v, kind)
        if s.items is not None:
            stack.extend((item, s.items, f"{here}[{i}]") for i, item in reversed(list(enumerate(v))))
        if s.fields:
            for key in s.required:
                if key not in v:
                    _fail(name, f"{here}.{key}" if here else key, s.fields[key].what, _MISSING, kind)
            for key, sub in reversed(list(s.fields.items())):
                if key in v:
                    stack.append((v[key], sub, f"{here}.{key}" if here else key))


def _depth(value: Any, name: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_DEPTH:
            from layerlab.report_diff.load import ReportError

            raise ReportError(f"{name} nests objects and lists more than {MAX_DEPTH} deep, which no layerlab "
                              "report does", where=name, expected=f"at most {MAX_DEPTH} levels", got=f"> {MAX_DEPTH}",
                              hint="is it a layerlab --json report?")
        if isinstance(v, dict):
            stack.extend((x, depth + 1) for x in v.values() if isinstance(x, (dict, list)))
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v if isinstance(x, (dict, list)))

"""Read a report to compare: a JSON file written by ``layerlab … --json``, a dict, or a report object.

Bad input is an error with exit 2 that says which file and what is wrong with it: not a file, not
JSON (``file:line:col`` of the first bad character), not a layerlab report (no ``schema`` number, or
one below 1, which no layerlab report has), or a report written by a newer layerlab than this one (its
``schema`` is higher than the one this version reads). A ``manifest`` it carries is checked the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Tuple

from layerlab.errors import LayerlabError

#: the report kinds diff reads, and the newest schema of each it understands
READABLE = {
    "inspect-report": 1, "gradcheck-report": 1, "gradcheck-matrix": 1, "profile-report": 1,
}
MANIFEST_SCHEMA_READ = 1
#: the largest report file read (a report of a 100-layer model is a few MB; JSON takes ~10× its size in memory)
MAX_BYTES = 256 * 2**20
_HOW = "the output of a layerlab command's --json (layerlab inspect SPEC --json > A.json)"


class ReportError(LayerlabError):
    """A report that ``layerlab diff`` cannot read (exit 2)."""

    kind = "report"


def load(source: Any, label: str) -> Tuple[Dict[str, Any], str]:
    """``(the report as a JSON-ready dict, a name for it)``. ``label`` (``A``/``B``) names an object."""
    if isinstance(source, (str, Path)):
        return _read_file(Path(source)), str(source)
    from layerlab.serialize import to_jsonable

    if isinstance(source, dict):  # a --json file read back, or report.to_dict() (records still objects)
        return _checked(to_jsonable(source), label), label

    if not callable(getattr(source, "to_dict", None)) and not hasattr(source, "__dataclass_fields__"):
        raise ReportError(f"{label} is a {type(source).__name__}, not a layerlab report", where=label,
                          expected="a report object, a dict from a --json file, or the path of one",
                          got=type(source).__name__)
    return _checked(to_jsonable(source), label), label


def kind_of(report: Dict[str, Any]) -> str:
    """The report's kind; inspect reports predate the ``kind`` key and are known by their keys."""
    kind = report.get("kind")
    if isinstance(kind, str):
        return kind
    if {"calls", "params", "backward"} <= report.keys():
        return "inspect-report"
    return "unknown"


def _read_file(path: Path) -> Dict[str, Any]:
    name = str(path)
    if not path.exists():
        raise ReportError(f"no such file: {name!r}", where=name, hint="save a report first: " + _HOW)
    if not path.is_file():
        raise ReportError(f"{name!r} is not a regular file", where=name, expected="a JSON report file",
                          got="a directory" if path.is_dir() else "a device, FIFO or socket")
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise ReportError(f"{name!r} is {size / 2**20:,.0f} MiB, larger than any layerlab report this reads",
                          where=name, expected=f"at most {MAX_BYTES // 2**20} MiB", got=f"{size:,} bytes", hint=_HOW)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ReportError(f"{name!r} is not UTF-8 text (byte {exc.start}), so not a JSON report", where=name,
                          hint=_HOW) from None
    except OSError as exc:
        raise ReportError(f"cannot read {name!r}: {exc.strerror or type(exc).__name__}", where=name) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportError(f"{name} is not valid JSON: {exc.msg}", where=f"{name}:{exc.lineno}:{exc.colno}",
                          hint="was the file cut short, or is it the human output (without --json)?") from None
    except RecursionError:  # json's decoder recurses once per [ or {
        raise ReportError(f"{name} nests objects and lists too deep to read, which no layerlab report does",
                          where=name, hint=_HOW) from None
    except ValueError as exc:  # a number of more than 4300 digits (Python's int limit)
        raise ReportError(f"{name} is not a JSON report layerlab can read: {str(exc).splitlines()[0][:200]}",
                          where=name, hint=_HOW) from None
    return _checked(data, name)


def _checked(data: Any, name: str) -> Dict[str, Any]:
    if not isinstance(data, dict) or not isinstance(data.get("schema"), int) or isinstance(data.get("schema"), bool):
        got = f"a JSON {type(data).__name__}" if not isinstance(data, dict) else \
            "an object with keys " + ", ".join(list(map(str, data))[:6]) + ("…" if len(data) > 6 else "")
        raise ReportError(f"{name} is not a layerlab report (no \"schema\" number)", where=name, expected=_HOW,
                          got=got)
    kind = kind_of(data)
    if data["schema"] < 1:  # every layerlab report starts at schema 1
        raise ReportError(f"{name} has \"schema\": {data['schema']}, which no layerlab report has", where=name,
                          expected="schema ≥ 1", got=data["schema"],
                          hint="was it edited by hand, or written by another tool? A report is " + _HOW)
    newest = READABLE.get(kind)
    if newest is not None and data["schema"] > newest:
        raise ReportError(f"{name} is a {kind} of schema {data['schema']}, newer than this layerlab reads",
                          where=name, expected=f"schema ≤ {newest}", got=data["schema"],
                          hint="upgrade layerlab to compare it")
    _check_manifest(data.get("manifest"), name)
    from layerlab.report_diff import wellformed

    wellformed.check(data, kind, name)
    return data


def _check_manifest(m: Any, name: str) -> None:
    """A report may carry no manifest (written before layerlab recorded one); one it carries is an
    object whose ``schema`` is a whole number from 1 to :data:`MANIFEST_SCHEMA_READ`."""
    if m is None:
        return
    schema = m.get("schema") if isinstance(m, dict) else None
    whole = isinstance(schema, int) and not isinstance(schema, bool)
    if not whole or schema < 1:
        if not isinstance(m, dict):
            got = f"a JSON {type(m).__name__}"
        elif "schema" not in m:
            got = 'no "schema"'
        else:
            got = f'"schema": {schema}' if whole else f'a {type(schema).__name__} as "schema"'
        raise ReportError(f'{name} has a "manifest" that is not a layerlab run manifest', where=name,
                          expected='an object with "schema" ≥ 1 (as layerlab … --json writes it)', got=got,
                          hint='was the file edited by hand? delete the "manifest" key to compare the results alone')
    if schema > MANIFEST_SCHEMA_READ:
        raise ReportError(f"{name} has a manifest of schema {schema}, newer than this layerlab reads",
                          where=name, expected=f"schema ≤ {MANIFEST_SCHEMA_READ}", got=schema,
                          hint="upgrade layerlab to compare it")

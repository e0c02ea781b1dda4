"""Probes named in a spec's ``probes:`` section or on the command line (``--probe``).

A spec::

    probes:
      - attention                      # a built-in probe by name
      - import: ./my_probes.py:norms   # a custom probe (module, inputs, output) -> dict
        modules: "encoder.*"           # optional: only modules whose path matches this glob
      - my_pkg.probes:entropy          # an import path alone works too

and ``--probe attention,sparsity`` / ``--probe my_pkg.probes:entropy`` on the command line. An
import path runs the user's code, so it needs ``--allow-import`` (``allow_import=True``), exactly
as a layer given by import path does (:mod:`layerlab.spec.resolve`).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

from layerlab.errors import SpecError, UsageError
from layerlab.spec.limits import clean_text

__all__ = ["from_section", "from_option"]

_KEYS = ("import", "modules", "name")


def _is_import(text: str) -> bool:
    return ":" in text


def _builtin(text: str, where: str, error) -> str:
    from layerlab.probe.probes import BUILTIN

    if text not in BUILTIN:
        shown = clean_text(text, 80)  # a name is echoed, never megabytes of it
        raise error(f"unknown probe {shown!r}", where=where, expected=" | ".join(BUILTIN), got=shown,
                    hint="a custom probe is an import path to a function: my_module:my_probe (needs --allow-import)")
    return text


def _custom(path: str, where: str, allow_import: bool, base_dir: Optional[str], modules: Optional[str] = None,
            name: Optional[str] = None, error=SpecError):
    from layerlab.probe.probes.custom import CallableProbe
    from layerlab.spec.resolve import is_trusted, resolve_callable

    if not allow_import and not is_trusted(path):
        raise error(f"probe {clean_text(path, 200)!r} is an import path: importing it runs its code, and layerlab never does that "
                    "by itself", where=where,
                    hint="pass --allow-import if you trust this code (probes=[my_function] in Python)")
    try:
        fn: Callable = resolve_callable(path, where=where, allow_import=True, base_dir=base_dir).cls
    except SpecError as exc:
        if error is SpecError:
            raise
        raise error(exc.message, where=where, expected=exc.expected, got=exc.got, hint=exc.hint) from None
    if isinstance(fn, type):
        raise error(f"probe {clean_text(path, 200)!r} is a class; a custom probe is a function (module, inputs, output) -> dict",
                    where=where, got=fn.__name__)
    return CallableProbe(fn, modules=modules, name=name or path.rpartition(":")[2])


def from_section(section: Any, marks: Any, allow_import: bool = False, base_dir: Optional[str] = None) -> List[Any]:
    """The probes a spec's ``probes:`` section asks for (names and :class:`CallableProbe`s)."""
    mark = marks if callable(marks) else (lambda *path: "probes")
    if isinstance(section, (str, dict)):
        section = [section]
    if not isinstance(section, list):
        raise SpecError("probes: is a list of probe names or {import: module:function}", where=mark("probes"),
                        expected="[attention, sparsity, {import: my_module:my_probe, modules: 'encoder.*'}]",
                        got=type(section).__name__)
    out: List[Any] = []
    for i, item in enumerate(section):
        where = mark("probes", i)
        if isinstance(item, str):
            text = item.strip()
            out.append(_custom(text, where, allow_import, base_dir) if _is_import(text) else _builtin(text, where, SpecError))
        elif isinstance(item, dict):
            unknown = [k for k in item if k not in _KEYS]
            if unknown or "import" not in item:
                raise SpecError(f"unknown key {unknown[0]!r} in a probe" if unknown else "a probe given as a mapping "
                                "needs import:", where=mark("probes", i, unknown[0]) if unknown else where,
                                expected="import: module:function, and optionally modules: GLOB, name: NAME",
                                got=", ".join(map(str, item)))
            for key in ("import", "modules", "name"):
                if key in item and not isinstance(item[key], str):
                    raise SpecError(f"{key}: must be a string", where=mark("probes", i, key),
                                    got=type(item[key]).__name__)
            out.append(_custom(item["import"].strip(), mark("probes", i, "import"), allow_import, base_dir,
                               modules=item.get("modules"), name=item.get("name")))
        else:
            raise SpecError("a probe is a name or {import: module:function}", where=where,
                            expected="attention | sparsity | dead | rank | … or a mapping", got=type(item).__name__)
    return out


def from_option(values: Optional[List[str]], allow_import: bool = False) -> List[Any]:
    """The probes ``--probe`` asks for (each value a comma-separated list)."""
    out: List[Any] = []
    if values and not any(t.strip() for value in values for t in value.split(",")):
        # `--probe ""` or `--probe ,` (an empty shell variable): say so rather than run no probe silently
        raise UsageError("--probe names no probe", where="--probe", expected="attention | sparsity | dead | rank | "
                         "… or module:function", got=", ".join(repr(v) for v in values)[:200],
                         hint="drop --probe, or name a probe: --probe sparsity")
    for value in values or []:
        for text in (t.strip() for t in value.split(",")):
            if not text:
                continue
            out.append(_custom(text, "--probe", allow_import, None, error=UsageError) if _is_import(text)
                       else _builtin(text, "--probe", UsageError))
    return out

"""YAML text → plain Python data plus the line and column of every node.

Only PyYAML's *safe* loader is used (``yaml.SafeLoader``: plain data, no Python tags), so a spec
file can never run code by being read. Composing the node tree first gives each value its mark;
:class:`Marks` maps a path of keys and indices (``("block", 2, "args", "padding")``) to
``file:line:col`` (1-based), falling back to the nearest enclosing node. A mapping entry is marked where its key is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Tuple

import yaml

from layerlab.errors import SpecError

PathKey = Tuple[Any, ...]


class Marks:
    """Where each value of a loaded spec was written."""

    def __init__(self, filename: str, table: Dict[PathKey, Tuple[int, int]]) -> None:
        self.filename = filename
        self._table = table

    def __call__(self, *path: Any) -> str:
        """``file:line:col`` of ``path`` (or of its nearest ancestor that has a mark)."""
        path = tuple(path)
        while path and path not in self._table:
            path = path[:-1]
        line, col = self._table.get(path, (1, 1))
        return f"{self.filename}:{line}:{col}"

    @classmethod
    def none(cls, label: str) -> "Marks":
        """Marks for data that did not come from a file (a registry entry's defaults)."""
        return _NoMarks(label)


class _NoMarks(Marks):
    def __init__(self, label: str) -> None:
        super().__init__(label, {})

    def __call__(self, *path: Any) -> str:
        return self.filename


def _mark(node: yaml.Node) -> Tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _walk(loader: yaml.SafeLoader, node: yaml.Node, path: PathKey, table: Dict, filename: str) -> None:
    table.setdefault(path, _mark(node))
    if isinstance(node, yaml.MappingNode):
        seen: Dict[Any, Tuple[int, int]] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise SpecError(
                    "a mapping key must be a plain name", where=f"{filename}:{_mark(key_node)[0]}:{_mark(key_node)[1]}",
                    got=str(key),
                )
            if key in seen:
                line, col = _mark(key_node)
                raise SpecError(
                    f"duplicate key {key!r} (first written at line {seen[key][0]})",
                    where=f"{filename}:{line}:{col}",
                    hint="YAML keeps only the last one; remove one of them",
                )
            seen[key] = table[path + (key,)] = _mark(key_node)
            _walk(loader, value_node, path + (key,), table, filename)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(loader, item, path + (i,), table, filename)


def parse_yaml(text: str, filename: str = "<spec>") -> Tuple[Any, Marks]:
    """Parse ``text`` with the safe loader; return ``(data, marks)``.

    Raises :class:`SpecError` (exit 2) with ``file:line:col`` for syntax errors and duplicate keys.
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise SpecError("the spec is empty", where=filename, hint="start with `layer: Conv2d` or `block:`")
        table: Dict[PathKey, Tuple[int, int]] = {}
        _walk(loader, node, (), table, filename)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark else filename
        problem = exc.problem or "invalid YAML"
        context = f" ({exc.context})" if exc.context else ""
        raise SpecError(
            f"YAML syntax error: {problem}{context}", where=where,
            hint="check indentation, colons and brackets around this position",
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"YAML error: {exc}", where=filename) from None
    finally:
        loader.dispose()
    return data, Marks(filename, table)


def read_spec_file(path: str) -> Tuple[Any, Marks]:
    """Read and parse a spec file; a missing or unreadable file is a :class:`SpecError`."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"no such spec file: {path}", where=path, hint="check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read spec file {path}: {exc}", where=path) from None
    return parse_yaml(text, str(path))

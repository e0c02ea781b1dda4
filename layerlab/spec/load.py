"""YAML text → plain Python data plus the line and column of every node.

Only PyYAML's *safe* loader is used (``yaml.SafeLoader``: plain data, no Python tags), so a spec
file can never run code by being read. Composing the node tree first gives each value its mark;
:class:`Marks` maps a path of keys and indices (``("block", 2, "args", "padding")``) to
``file:line:col`` (1-based), falling back to the nearest enclosing node. A mapping entry is marked where its key is written.

Reading is bounded (see :mod:`layerlab.spec.limits`): only regular files, at most
``MAX_SPEC_BYTES`` read; while composing, nesting deeper than ``MAX_DEPTH`` and more than
``MAX_VALUES`` values *counting every alias as the copy it stands for* are refused where they
occur, as is an alias inside the value it names (``&a [*a]``). Aliases are never expanded here:
the constructed data shares them, and the mark walk visits each node once.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Dict, Optional, Tuple

import yaml

from layerlab.errors import SpecError
from layerlab.spec import limits

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


def _at(filename: str, mark: Any) -> str:
    return f"{filename}:{mark.line + 1}:{mark.column + 1}"


class _GuardedLoader(yaml.SafeLoader):
    """The safe loader, counting depth and alias-expanded values while it composes."""

    def __init__(self, text: str, filename: str) -> None:
        super().__init__(text)
        self._filename = filename
        self._depth = 0
        self._values = 0
        self._open: set = set()  # anchors whose value is still being composed
        self._sizes: Dict[str, int] = {}  # anchor → values it stands for

    def _count(self, n: int, mark: Any, alias: Optional[str] = None) -> None:
        self._values += n
        if self._values > limits.MAX_VALUES:
            what = f"the alias *{alias} (which stands for {n:,} values)" if alias else "this value"
            raise SpecError(
                f"the spec holds more than {limits.MAX_VALUES:,} values, counting each alias as a copy of what "
                f"it names; {what} crosses that limit",
                where=_at(self._filename, mark), expected=f"at most {limits.MAX_VALUES:,} values",
                hint="a layer spec is a few dozen values: remove the nested aliases (a 'billion laughs' pattern)",
            )

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            anchor = event.anchor
            if anchor in self._open:
                raise SpecError(
                    f"the alias *{anchor} is inside the value &{anchor} names (a value that contains itself)",
                    where=_at(self._filename, event.start_mark),
                    hint=f"a spec is a tree: replace *{anchor} by the value it should repeat",
                )
            self._count(self._sizes.get(anchor, 1), event.start_mark, alias=anchor)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > limits.MAX_DEPTH:
            raise SpecError(
                f"the spec nests deeper than {limits.MAX_DEPTH} levels (brackets, blocks and mappings)",
                where=_at(self._filename, event.start_mark), expected=f"at most {limits.MAX_DEPTH} levels",
                hint="flatten the nesting: a block of blocks rarely needs more than a few levels",
            )
        before = self._values
        self._count(1, event.start_mark)
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self._open.add(anchor)
        node = super().compose_node(parent, index)
        if anchor is not None:
            self._open.discard(anchor)
            self._sizes[anchor] = self._values - before
        self._depth -= 1
        return node


def _walk(loader: yaml.SafeLoader, root: yaml.Node, table: Dict, filename: str) -> None:
    """Record the mark of every path; each node is visited once (an alias is not expanded)."""
    stack = [(root, ())]
    visited = set()
    while stack:
        node, path = stack.pop()
        table.setdefault(path, _mark(node))
        if id(node) in visited:
            continue
        visited.add(id(node))
        children: list = []
        if isinstance(node, yaml.MappingNode):
            seen: Dict[Any, Tuple[int, int]] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = loader.construct_object(key_node, deep=True)
                if not isinstance(key, (str, int, float, bool)) and key is not None:
                    raise SpecError(
                        "a mapping key must be a plain name", where=f"{filename}:{_mark(key_node)[0]}:{_mark(key_node)[1]}",
                        got=limits.clean_value(key),
                    )
                if key in seen:
                    line, col = _mark(key_node)
                    raise SpecError(
                        f"duplicate key {key!r} (first written at line {seen[key][0]})",
                        where=f"{filename}:{line}:{col}",
                        hint="YAML keeps only the last one; remove one of them",
                    )
                seen[key] = table[path + (key,)] = _mark(key_node)
                children.append((value_node, path + (key,)))
        elif isinstance(node, yaml.SequenceNode):
            children = [(item, path + (i,)) for i, item in enumerate(node.value)]
        stack.extend(reversed(children))  # in document order: an anchor is walked before its aliases


def parse_yaml(text: str, filename: str = "<spec>") -> Tuple[Any, Marks]:
    """Parse ``text`` with the safe loader; return ``(data, marks)``.

    Raises :class:`SpecError` (exit 2) with ``file:line:col`` for syntax errors, duplicate keys,
    characters YAML forbids (a NUL byte) and the limits of :mod:`layerlab.spec.limits`.
    """
    if len(text) > limits.MAX_SPEC_BYTES:
        raise _too_big(filename, len(text))
    loader = None
    try:
        loader = _GuardedLoader(text, filename)
        node = loader.get_single_node()
        if node is None:
            raise SpecError("the spec is empty", where=filename, hint="start with `layer: Conv2d` or `block:`")
        table: Dict[PathKey, Tuple[int, int]] = {}
        _walk(loader, node, table, filename)
        data = loader.construct_document(node)
    except yaml.reader.ReaderError as exc:
        raise _bad_character(text, filename, exc.position) from None
    except yaml.constructor.ConstructorError as exc:
        if "could not determine a constructor for the tag" not in str(exc.problem):
            raise _syntax_error(exc, filename) from None
        mark = exc.problem_mark or exc.context_mark
        tag = str(exc.problem).rpartition("tag ")[2].strip("'").replace("tag:yaml.org,2002:", "!!")
        raise SpecError(
            f"the YAML tag {limits.clean_text(tag, 120)} is refused: a spec is plain data, read with yaml.safe_load, "
            "and a tag that builds a Python object would run code",
            where=f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark else filename, got=limits.clean_text(tag, 120),
            hint="write the value itself (a number, a string, a list, a mapping); name a layer with layer: "
                 "(a class from your own file needs --allow-import)",
        ) from None
    except yaml.MarkedYAMLError as exc:
        raise _syntax_error(exc, filename) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"YAML error: {exc}", where=filename) from None
    except RecursionError:  # the limits above should make this unreachable; never a traceback
        raise SpecError(f"the spec nests too deeply to read (more than {limits.MAX_DEPTH} levels)",
                        where=filename, hint="flatten the nesting") from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, Marks(filename, table)


def _syntax_error(exc: yaml.MarkedYAMLError, filename: str) -> SpecError:
    mark = exc.problem_mark or exc.context_mark
    where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark else filename
    problem = exc.problem or "invalid YAML"
    context = f" ({exc.context})" if exc.context else ""
    return SpecError(f"YAML syntax error: {problem}{context}", where=where,
                     hint="check indentation, colons and brackets around this position")


def _bad_character(text: str, filename: str, position: int) -> SpecError:
    before = text[:position]
    line = before.count("\n") + 1
    col = position - (before.rfind("\n") + 1) + 1
    ch = text[position] if position < len(text) else "?"
    return SpecError(
        f"the spec contains the character {limits.char_name(ch)}, which YAML does not allow in a file",
        where=f"{filename}:{line}:{col}", got=repr(ch),
        hint="a spec is plain UTF-8 text: remove it (write a control character in a quoted string as \"\\x1b\")",
    )


def _too_big(filename: str, size: int) -> SpecError:
    return SpecError(
        f"the spec file is {limits.format_bytes(size)}; a spec may be at most {limits.format_bytes(limits.MAX_SPEC_BYTES)}",
        where=filename, expected=f"≤ {limits.MAX_SPEC_BYTES:,} bytes", got=f"{size:,} bytes",
        hint="is this the right file? a layer spec is a few hundred bytes",
    )


def read_spec_file(path: str) -> Tuple[Any, Marks]:
    """Read and parse a spec file; a missing, unreadable, oversized or non-regular file is a :class:`SpecError`.

    Only regular files are read (``/dev/zero``, a FIFO or a directory are refused before opening),
    and never more than ``MAX_SPEC_BYTES + 1`` bytes.
    """
    shown = limits.clean_text(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise SpecError(f"no such spec file: {shown}", where=shown, hint="check the path") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise SpecError(f"cannot read spec file {shown}: {limits.clean_text(exc)}", where=shown) from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a device, FIFO or socket)"
        raise SpecError(f"the spec {shown} is {kind}", where=shown, hint="give the path of a .yaml file")
    if st.st_size > limits.MAX_SPEC_BYTES:
        raise _too_big(shown, st.st_size)
    try:
        with open(path, "rb") as f:
            raw = f.read(limits.MAX_SPEC_BYTES + 1)  # a file that grows (or lies in st_size) stops here
    except OSError as exc:
        raise SpecError(f"cannot read spec file {shown}: {limits.clean_text(exc)}", where=shown) from None
    if len(raw) > limits.MAX_SPEC_BYTES:
        raise _too_big(shown, len(raw))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        good = raw[:exc.start].decode("utf-8", errors="replace")
        line, col = good.count("\n") + 1, len(good) - (good.rfind("\n") + 1) + 1
        raise SpecError(f"the spec is not UTF-8 text: byte 0x{raw[exc.start]:02x} cannot be decoded",
                        where=f"{shown}:{line}:{col}", hint="save the file as UTF-8") from None
    return parse_yaml(text, shown)

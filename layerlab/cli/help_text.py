"""A command's ``--help`` text from its docstring, with prose reflowed to the terminal's width.

Docstrings are wrapped at the source's line length. Recent typer keeps those line breaks in
``rich`` markup mode (older releases dropped them), so help printed in a terminal of another width
came out ragged: a line break mid-sentence, then a short line. Prose paragraphs are joined into one
line here and Rich wraps them; a paragraph with an indented line (examples of command lines) or a
list item keeps its line breaks, because there they are meant.
"""

from __future__ import annotations

import inspect

_LIST_MARKS = ("- ", "* ", "• ")


def reflow(doc: str) -> str:
    """``doc`` dedented, each prose paragraph on one line; other paragraphs as written."""
    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    return "\n\n".join(_join(p) for p in paragraphs)


def _join(paragraph: str) -> str:
    lines = paragraph.split("\n")
    if any(line.startswith((" ", "\t")) or line.lstrip().startswith(_LIST_MARKS) for line in lines):
        return paragraph
    return " ".join(line.strip() for line in lines)

"""``--help`` prose is wrapped by the terminal, not by the docstring's source lines.

Each command's help comes from its docstring, whose lines end at the source's width. At a wide
terminal every prose sentence must come out on one line (a source line break mid-sentence used to
print as a line break, then a short line); command-line examples keep one line each.
"""

import re

import pytest

COMMANDS = ["explain-shape", "inspect", "gradcheck", "export-check", "profile", "train-check",
            "precision-check", "ddp-check", "diff", "list"]


@pytest.fixture
def wide_help(capsys, monkeypatch):
    from layerlab.cli.app import main

    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setenv("NO_COLOR", "1")

    def _help(command):
        assert main([command, "--help"]) == 0
        return capsys.readouterr().out

    return _help


def _prose(doc):
    """Each prose paragraph of a docstring as one line of words, markup removed."""
    import inspect

    for paragraph in inspect.cleandoc(doc).split("\n\n"):
        lines = paragraph.split("\n")
        if any(line.startswith(" ") or line.lstrip().startswith(("- ", "* ", "• ")) for line in lines):
            continue
        yield re.sub(r"\[/?[a-z ]*\]", "", " ".join(line.strip() for line in lines))


@pytest.mark.parametrize("command", COMMANDS)
def test_each_prose_paragraph_prints_on_one_line(command, wide_help):
    from layerlab.cli import app as app_module

    callback = next(c.callback for c in app_module.app.registered_commands if c.name == command)
    out = " ".join(line.strip() for line in wide_help(command).splitlines() if line.strip())
    printed_lines = [line.strip() for line in wide_help(command).splitlines()]
    paragraphs = list(_prose(callback.__doc__))
    assert paragraphs, "every command documents itself"
    for paragraph in paragraphs:
        assert paragraph in out, f"{command}: {paragraph!r} is not in its help"
        assert paragraph in printed_lines, f"{command}: {paragraph!r} is broken across lines"


def test_examples_keep_one_line_each(wide_help):
    lines = [line.strip() for line in wide_help("gradcheck").splitlines()]
    assert "layerlab gradcheck lstm" in lines
    assert "layerlab gradcheck --all" in lines

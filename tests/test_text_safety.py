"""layerlab.text_safety: the one sanitiser for untrusted text (names, messages, file names)."""

from __future__ import annotations

import dataclasses
import json
from typing import List

import pytest

from layerlab.serialize import dumps
from layerlab.text_safety import FIELD_CHARS, clean, clean_json, display_copy, escape, unsafe


@pytest.mark.parametrize("raw, shown", [
    ("\x1b[2J", "\\x1b[2J"),
    ("\x1b]0;title\x07", "\\x1b]0;title\\x07"),
    ("a\x00b", "a\\x00b"),
    ("\x9b31m", "\\x9b31m"),                 # C1 CSI: a terminal in 8-bit mode reads it as ESC [
    ("\x7f", "\\x7f"),
    ("\u202eevil\u202c", "\\u202eevil\\u202c"),
    ("\u2066x\u2069\u200e\u200f\u061c", "\\u2066x\\u2069\\u200e\\u200f\\u061c"),
    ("one\ntwo", "one⏎two"),
    ("cr\rlf", "cr\\x0dlf"),
    ("tab\there", "tab\\x09here"),
    ("\u2028", "\\u2028"),
    ("caf\udce9", "caf\\xe9"),               # a byte that was not UTF-8 (surrogateescape)
    ("\ud800", "\\ud800"),                   # any other lone surrogate
])
def test_unsafe_characters_are_shown_as_their_escape(raw: str, shown: str) -> None:
    assert clean(raw) == shown
    clean(raw).encode("utf-8")  # never raises


@pytest.mark.parametrize("text", ["encoder.layers.3.linear1", "naïve ✓ → ‖x‖", "[bold]x[/]", "", "a\\x1b"])
def test_plain_text_is_unchanged(text: str) -> None:
    assert clean(text) == text
    assert not unsafe(text)


def test_a_long_field_is_cut_with_the_count_of_what_was_left_out() -> None:
    text = "m" * 1_048_576
    out = clean(text)
    assert len(out) <= FIELD_CHARS
    left_out = int(out.rsplit("(+", 1)[1].split(" ")[0])
    assert out.startswith("m" * 900) and out.endswith(" chars)")
    assert len(out) - len(f"…(+{left_out} chars)") + left_out == len(text)


def test_a_cut_never_splits_an_escape_and_stays_within_the_limit() -> None:
    out = clean("\x1b" * 5000, limit=100)
    assert len(out) <= 100
    body = out.split("…")[0]
    assert body == "\\x1b" * (len(body) // 4)


@pytest.mark.parametrize("text", ["\x1b" * 5000, "x\ny" * 900, "é" * 3000 + "\udcff", "ok", "a\u202e" * 600])
def test_clean_is_idempotent(text: str) -> None:
    once = clean(text)
    assert clean(once) == once
    j = clean(text, limit=500, newlines=True)
    assert clean(j, limit=500, newlines=True) == j


def test_escape_shows_rich_markup_literally() -> None:
    from rich.console import Console

    console = Console(width=200, record=True, file=open("/dev/null", "w"), force_terminal=True)
    for hostile in ("[bold red]MK[/bold red]", "[link=file:///etc/passwd]LN[/link]", "trailing \\", "[/]"):
        console.print(f"[dim]name:[/] {escape(hostile)}")
    text = console.export_text()
    assert "[bold red]MK[/bold red]" in text and "[link=file:///etc/passwd]LN[/link]" in text
    assert "trailing \\" in text and "[/]" in text


def test_json_keeps_newlines_and_cleans_keys_values_and_surrogates() -> None:
    doc = {"a\x1bb": ["line one\nline two", "\udcff", 1.5, None], "n": "\u202e"}
    out = clean_json(doc)
    assert out == {"a\\x1bb": ["line one\nline two", "\\xff", 1.5, None], "n": "\\u202e"}
    text = dumps(doc)
    text.encode("utf-8")  # a lone surrogate would make this raise
    assert json.loads(text) == out


@dataclasses.dataclass
class _Row:
    path: str
    values: List[float]


@dataclasses.dataclass(frozen=True)
class _Report:
    model: str
    rows: List[_Row]
    index: dict


def test_display_copy_cleans_every_string_and_leaves_the_report_alone() -> None:
    row = _Row("enc\nFORGED", [1.0, 2.0])
    report = _Report("M\x1b[2J", [row, row], {"enc\nFORGED": row})
    shown = display_copy(report)
    assert shown.model == "M\\x1b[2J" and shown.rows[0].path == "enc⏎FORGED"
    assert shown.rows[0] is shown.rows[1] is shown.index["enc⏎FORGED"]  # shared parts stay shared
    assert report.model == "M\x1b[2J" and row.path == "enc\nFORGED"  # the original is untouched
    plain = _Report("M", [_Row("a", [1.0])], {})
    assert display_copy(plain) is plain  # nothing to clean: nothing copied

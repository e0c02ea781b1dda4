"""Hostile text for the injection matrix (``payloads.json``, data): see :func:`payload`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

CORPUS = Path(__file__).with_name("payloads.json")


def parts() -> List[Dict]:
    """The payload's parts, as stored (``payloads.json`` says what each key means)."""
    return json.loads(CORPUS.read_text(encoding="ascii"))["parts"]


def payload(tag: str, file_name: bool = False) -> str:
    """Every part's text for the place ``tag``, joined; ``file_name=True``: the parts a file name
    can hold (no NUL, no '/')."""
    chosen = [p for p in parts() if not (file_name and p.get("not_in_file_names"))]
    return "".join((p.get("file_name_text") if file_name and "file_name_text" in p else p["text"]).replace("{tag}", tag)
                   for p in chosen)

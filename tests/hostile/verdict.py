"""What a run of a hostile entry must look like, as a list of problems (empty: it behaved).

The contract (issue 11), for every command that takes a spec:

* it ends by itself within the time limit and under the memory cap (no hang, no kill);
* the exit code is one the entry allows (a refusal of bad input is 2);
* no ``Traceback`` anywhere;
* no raw control characters (C0 other than tab and newline, DEL, C1) in what it prints, so a
  spec cannot drive the terminal, and nothing echoed runs to megabytes;
* human mode: a refusal is exactly one message on stderr (starting ``error:``), a success
  prints no ``error:``;
* ``--json``: stderr is a stream of JSON documents, stdout is one JSON document or empty, and a
  refusal ends with an error object whose ``exit_code`` is the exit code;
* code the entry forbids (a YAML python tag) did not run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, List, Optional

from tests.hostile.corpus import Entry
from tests.hostile.harness import Outcome

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
MAX_OUTPUT_BYTES = 200_000


def json_documents(text: str) -> Optional[List[Any]]:
    """``text`` as a sequence of JSON documents (whitespace between them), or None if it is not."""
    decoder, docs, pos = json.JSONDecoder(), [], 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            return docs
        try:
            doc, pos = decoder.raw_decode(text, pos)
        except ValueError:
            return None
        docs.append(doc)


def first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")[:200]


def problems(entry: Entry, command: str, json_mode: bool, outcome: Outcome, cwd: Optional[str] = None) -> List[str]:
    """Every way ``outcome`` breaks the contract above (empty list: none)."""
    found: List[str] = []
    if outcome.timed_out:
        return [f"hang: killed after {outcome.seconds:.0f} s"]
    if outcome.signal is not None:
        return [f"killed by signal {outcome.signal} (memory cap?) after {outcome.seconds:.1f} s"]
    allowed = entry.expected(command, json_mode)
    if outcome.rc not in allowed:
        found.append(f"exit {outcome.rc}, expected {sorted(allowed)}")
    if "Traceback (most recent call last)" in outcome.stderr + outcome.stdout:
        found.append("traceback")
    if CONTROL.search(outcome.stdout + outcome.stderr):
        char = CONTROL.search(outcome.stdout + outcome.stderr).group()
        found.append(f"raw control character {char!r} in the output")
    if outcome.stdout_bytes + outcome.stderr_bytes > MAX_OUTPUT_BYTES:
        found.append(f"{outcome.stdout_bytes + outcome.stderr_bytes:,} bytes of output (echo not truncated)")
    found += _json_problems(outcome) if json_mode else _human_problems(outcome)
    if entry.forbid and cwd and (Path(cwd) / entry.forbid).exists():
        found.append(f"{entry.forbid} exists: code from the spec ran")
    return found


def _human_problems(outcome: Outcome) -> List[str]:
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    if outcome.rc == 2:
        if not lines:
            return ["exit 2 with nothing on stderr"]
        if not lines[0].startswith("error:") and not lines[0].startswith("Usage:"):
            return [f"stderr does not start with the error: {lines[0][:120]!r}"]
        if len(errors) > 1:
            return [f"{len(errors)} error messages on stderr, expected one"]
    if outcome.rc == 0 and errors:
        return [f"exit 0 with an error on stderr: {errors[0][:120]!r}"]
    if outcome.rc == 1 and len(errors) > 1:
        return [f"{len(errors)} error messages on stderr, expected at most one"]
    return []


def _json_problems(outcome: Outcome) -> List[str]:
    err_docs = json_documents(outcome.stderr)
    if err_docs is None:
        return [f"--json: stderr is not JSON: {first_line(outcome.stderr)!r}"]
    out_docs = json_documents(outcome.stdout)
    if out_docs is None or len(out_docs) > 1:
        return [f"--json: stdout is not one JSON document: {first_line(outcome.stdout)!r}"]
    errors = [d for d in err_docs if isinstance(d, dict) and "error" in d and "message" in d]
    if outcome.rc == 2:
        if out_docs:
            return ["--json: exit 2 but a result on stdout"]
        if not errors or errors[-1] is not err_docs[-1]:
            return ["--json: exit 2 without an error object last on stderr"]
        if len(errors) > 1:
            return [f"--json: {len(errors)} error objects on stderr, expected one"]
        if errors[-1].get("exit_code") != 2:
            return [f"--json: error object says exit_code {errors[-1].get('exit_code')}, the process exited 2"]
    elif outcome.rc in (0, 1) and not out_docs and not errors:
        return [f"--json: exit {outcome.rc} with neither a result on stdout nor an error on stderr"]
    return []


def cause_line(entry: Entry, command: str, json_mode: bool, outcome: Outcome, found: List[str]) -> str:
    """One report line: the entry, the command, what broke, and the first line of stderr."""
    flag = " --json" if json_mode else ""
    return f"[{entry.cause}] {entry.name} · {command}{flag}: {'; '.join(found)} | {first_line(outcome.stderr)}"

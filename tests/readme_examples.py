"""Keep the README's examples real: every ```console block is the output of its command.

A block looks like::

    ```console
    $ layerlab explain-shape --input 32 --kernel 3 --stride 2
    …what the command printed (stdout, 100 columns, no colour)…
    ```

``python tests/readme_examples.py`` rewrites every block with fresh output;
``tests/test_readme.py`` re-runs the deterministic ones and fails if the README is stale.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Iterator, List, Tuple

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(r"```console\n\$ (layerlab [^\n]*)\n(.*?)```", re.S)

#: Commands whose output depends on nothing but their arguments (no timings): checked by tests.
DETERMINISTIC = ("layerlab explain-shape", "layerlab inspect")


_TIMING = re.compile(r"^(time\s+).*$", re.M)


def comparable(output: str) -> str:
    """The output with its timing line blanked: the one part that changes from run to run. The
    summary grid pads every row to its longest, often the timing row, so trailing blanks go too."""
    return "\n".join(line.rstrip() for line in _TIMING.sub(r"\1…", output).splitlines())


def blocks(text: str) -> Iterator[Tuple[str, str]]:
    for m in BLOCK.finditer(text):
        yield m.group(1), m.group(2)


def run(command: str) -> str:
    """Run ``layerlab …`` in-process at 100 columns without colour; return stdout."""
    from layerlab.cli.app import main

    os.environ["COLUMNS"] = "100"
    os.environ["NO_COLOR"] = "1"
    argv = shlex.split(command)[1:]
    out, err = io.StringIO(), io.StringIO()
    with _one_thread(not command.startswith("layerlab explain-shape")), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        main(argv)
    return out.getvalue()


@contextlib.contextmanager
def _one_thread(uses_torch: bool):
    """Statistics printed to 3 digits can differ in the last digit between thread counts (float
    sums in another order): examples are made and checked with one intra-op thread."""
    if not uses_torch:  # explain-shape never imports torch: nothing to pin
        yield
        return
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def update(text: str) -> str:
    def fresh(m: "re.Match") -> str:
        return f"```console\n$ {m.group(1)}\n{run(m.group(1))}```"

    return BLOCK.sub(fresh, text)


def main(argv: List[str]) -> int:
    text = README.read_text()
    README.write_text(update(text))
    print(f"updated {sum(1 for _ in blocks(text))} example(s) in {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The README is part of the feature: its commands are the ones CI runs, its examples real."""

import re
from pathlib import Path

import pytest

from tests import readme_examples

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    command = re.search(r'TEST_COMMAND="(.*)"', ci).group(1)
    assert command in README


@pytest.mark.parametrize(
    "command, shown",
    [b for b in readme_examples.blocks(README) if b[0].startswith(readme_examples.DETERMINISTIC)],
    ids=lambda v: v if isinstance(v, str) and v.startswith("layerlab") else "",
)
def test_readme_example_is_current(command, shown, tmp_path):
    # a picture the example saves under docs/ goes to a scratch folder here: the test checks what
    # the command prints, and must not rewrite the repository's files (tests/plot checks pictures)
    command = re.sub(r"(--plot(?:-histograms)? )docs/", lambda m: f"{m.group(1)}{tmp_path}/", command)
    if "--plot" in command:
        pytest.importorskip("matplotlib", reason="pictures need the [plot] extra")
    fresh = readme_examples.comparable(readme_examples.run(command))
    assert fresh == readme_examples.comparable(shown), (
        f"README example is stale: run `python tests/readme_examples.py` to refresh\n$ {command}")


PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


@pytest.mark.parametrize("code", PYTHON_BLOCK.findall(README), ids=lambda c: c.splitlines()[0][:40])
def test_readme_python_examples_run(code, capsys):
    exec(compile(code, "README.md", "exec"), {})

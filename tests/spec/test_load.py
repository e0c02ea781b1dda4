"""YAML → data with marks: syntax errors with line and column, duplicate keys, safe loading only."""

import pytest

from layerlab.errors import SpecError
from layerlab.spec.load import parse_yaml, read_spec_file


def test_marks_point_at_keys_and_items():
    data, marks = parse_yaml("layer: Conv2d\nargs:\n  in_channels: 3\n  kernel_size: 3\n", "a.yaml")
    assert data == {"layer": "Conv2d", "args": {"in_channels": 3, "kernel_size": 3}}
    assert marks("args", "kernel_size") == "a.yaml:4:3"
    assert marks("layer") == "a.yaml:1:1"
    assert marks("args", "nope") == "a.yaml:2:1"  # nearest ancestor


@pytest.mark.parametrize(
    "text, where, words",
    [
        ("layer: Conv2d\nargs: {in_channels: 3, kernel_size: 3\ninput: {shape: [1]}\n", "s.yaml:3:6", "expected ',' or '}'"),
        ("layer: Conv2d\n  args: 3\n", "s.yaml:2:7", "mapping values are not allowed here"),
        ("block:\n\t- ReLU\n", "s.yaml:2:1", "cannot start any token"),
    ],
)
def test_syntax_errors_have_line_and_column(text, where, words):
    with pytest.raises(SpecError, match="YAML syntax error") as info:
        parse_yaml(text, "s.yaml")
    assert info.value.where == where
    assert words in info.value.message
    assert info.value.exit_code == 2


def test_duplicate_keys_are_an_error():
    with pytest.raises(SpecError, match=r"duplicate key 'seed' \(first written at line 1\)") as info:
        parse_yaml("seed: 1\nlayer: ReLU\nseed: 2\n", "d.yaml")
    assert info.value.where == "d.yaml:3:1"


def test_python_tags_are_refused():
    with pytest.raises(SpecError, match="YAML"):
        parse_yaml("layer: !!python/object/apply:os.system ['echo hi']\n", "evil.yaml")


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    with pytest.raises(SpecError, match="the spec is empty"):
        read_spec_file(str(empty))
    with pytest.raises(SpecError, match="no such spec file"):
        read_spec_file(str(tmp_path / "missing.yaml"))

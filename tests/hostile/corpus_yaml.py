"""Hostile entries at the file and YAML level: bombs, nesting, bytes, encodings, odd documents.

See :mod:`tests.hostile.corpus` for what an entry is. Each expects exit 2 (a clean refusal)
unless it is a valid spec dressed up oddly (a BOM, CRLF line ends), which must simply work.
"""

from __future__ import annotations

import random

from tests.hostile.corpus import TINY, TINY_ARGS, Entry, codes


def _billion_laughs(levels: int, fan: int, where: str) -> str:
    """``levels`` anchors, each a list of ``fan`` aliases of the previous one: fan**levels leaves."""
    lines = ["a0: &a0 [1]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fan) + "]")
    anchors = "\n".join(lines)
    if where == "args":
        return f"layer: Conv2d\nargs:\n  in_channels: 1\n  out_channels: 2\n  kernel_size: *a{levels}\n" \
               f"input: {{shape: [1, 1, 5, 5]}}\nextra:\n  " + anchors.replace("\n", "\n  ") + "\n"
    return f"{TINY}name:\n  " + anchors.replace("\n", "\n  ") + "\n"


def _nested_blocks_block_style(depth: int) -> str:
    lines = ["block:"]
    for level in range(depth):
        lines.append("  " * (level + 1) + "- block:")
    lines.append("  " * (depth + 1) + "- ReLU")
    return "\n".join(lines) + "\ninput: {shape: [2, 3]}\n"


def _garbage(seed: int, size: int) -> bytes:
    rng = random.Random(seed)
    return bytes(rng.randrange(256) for _ in range(size))


ENTRIES = [
    # -- alias expansion (issue item 1) ------------------------------------------------------------
    Entry("alias_bomb_1e9", "alias-bomb", _billion_laughs(9, 10, "name")),
    Entry("alias_bomb_1e7_in_args", "alias-bomb", _billion_laughs(7, 10, "args")),
    Entry("alias_bomb_1e6", "alias-bomb", _billion_laughs(6, 10, "name")),
    Entry("alias_bomb_wide_2_40", "alias-bomb", _billion_laughs(40, 2, "name")),
    Entry("alias_bomb_shape", "alias-bomb",
          "big: &b [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\nb2: &b2 [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
          "b3: &b3 [*b2, *b2, *b2, *b2, *b2, *b2, *b2, *b2, *b2, *b2]\n"
          "b4: &b4 [*b3, *b3, *b3, *b3, *b3, *b3, *b3, *b3, *b3, *b3]\n"
          "b5: &b5 [*b4, *b4, *b4, *b4, *b4, *b4, *b4, *b4, *b4, *b4]\n"
          "b6: &b6 [*b5, *b5, *b5, *b5, *b5, *b5, *b5, *b5, *b5, *b5]\n"
          "b7: &b7 [*b6, *b6, *b6, *b6, *b6, *b6, *b6, *b6, *b6, *b6]\n"
          "layer: ReLU\ninput: {shape: *b7}\n"),
    Entry("recursive_alias_list", "recursive-alias", f"layer: Conv2d\nargs: &a [*a]\ninput: {{shape: [1, 1, 5, 5]}}\n"),
    Entry("recursive_alias_mapping", "recursive-alias", f"{TINY}name: &n {{again: *n}}\n"),
    Entry("recursive_alias_block", "recursive-alias", "block: &b\n  - block: *b\ninput: {shape: [2, 3]}\n"),
    Entry("recursive_alias_input", "recursive-alias",
          f"layer: Conv2d\nargs: {TINY_ARGS}\ninput: &i {{shape: [1, 1, 5, 5], init: *i}}\n"),
    # -- nesting depth (issue item 3) --------------------------------------------------------------
    Entry("nested_brackets_2000", "nesting", "layer: ReLU\ninput: {shape: " + "[" * 2000 + "2" + "]" * 2000 + "}\n"),
    Entry("nested_brackets_100k", "nesting", "layer: ReLU\ninput: {shape: " + "[" * 100_000 + "2" + "]" * 100_000 + "}\n"),
    Entry("nested_braces_1000", "nesting", f"{TINY}name: " + "{a: " * 1000 + "1" + "}" * 1000 + "\n"),
    Entry("nested_blocks_300", "nesting", _nested_blocks_block_style(300)),
    Entry("nested_blocks_flow_1000", "nesting",
          "block: " + "[{block: " * 1000 + "[ReLU]" + "}]" * 1000 + "\ninput: {shape: [2, 3]}\n"),
    Entry("unclosed_brackets_5000", "nesting", "layer: ReLU\ninput: {shape: " + "[" * 5000 + "\n"),
    # -- bytes and encodings (issue item 3) ---------------------------------------------------------
    Entry("nul_byte", "bytes", "layer: Conv2d\x00\nargs: " + TINY_ARGS + "\ninput: {shape: [1, 1, 5, 5]}\n"),
    Entry("nul_byte_in_value", "bytes", TINY + "name: \"tiny\x00conv\"\n"),
    Entry("raw_escape_byte", "bytes", TINY + "name: tiny\x1b[31m conv\n"),
    Entry("invalid_utf8", "encoding", TINY.encode() + b"name: \xff\xfe\xc3\x28 conv\n"),
    Entry("invalid_utf8_in_comment", "encoding", b"# \xc0\xaf\xed\xa0\x80\n" + TINY.encode()),
    Entry("binary_garbage", "encoding", _garbage(11, 4096)),
    Entry("utf8_bom_valid", "encoding", b"\xef\xbb\xbf" + TINY.encode(), expect=codes(0)),
    Entry("utf16_with_bom", "encoding", TINY.encode("utf-16"), expect=codes(0, 2)),
    Entry("crlf_valid", "encoding", TINY.replace("\n", "\r\n"), expect=codes(0)),
    # -- file kinds and sizes (issue item 3) --------------------------------------------------------
    Entry("huge_file_48mb", "size", TINY + "# " + "x" * (48 * 2**20) + "\n"),
    Entry("huge_file_one_line", "size", TINY + "description: " + "y" * (40 * 2**20) + "\n"),
    Entry("dev_zero", "special-file", kind="dev_zero"),
    Entry("fifo", "special-file", kind="fifo"),
    Entry("directory", "special-file", kind="dir", filename="spec_dir.yaml"),
    # -- code-running tags: must never run (asserted through ``forbid``) ---------------------------
    Entry("python_object_apply", "yaml-tag", "!!python/object/apply:os.system ['touch PWNED']\n", forbid="PWNED"),
    Entry("python_object_in_args", "yaml-tag",
          "layer: Conv2d\nargs: !!python/object/apply:os.system ['touch PWNED']\ninput: {shape: [1]}\n",
          forbid="PWNED"),
    Entry("python_name_tag", "yaml-tag", "layer: !!python/name:os.system\ninput: {shape: [1]}\n"),
    Entry("custom_tag", "yaml-tag", f"{TINY}seed: !evil 3\n"),
    Entry("binary_tag_dim", "yaml-tag", "layer: ReLU\ninput: {shape: !!binary aGVsbG8=}\n"),
    # -- document shape -----------------------------------------------------------------------------
    Entry("empty_file", "document", ""),
    Entry("only_comments", "document", "# nothing here\n# at all\n"),
    Entry("only_whitespace", "document", "   \n\n\t\n"),
    Entry("null_document", "document", "~\n"),
    Entry("top_level_list", "document", "- layer: Conv2d\n- input: [1]\n"),
    Entry("top_level_scalar", "document", "Conv2d\n"),
    Entry("top_level_int", "document", "42\n"),
    Entry("two_documents", "document", TINY + "---\n" + TINY),
    Entry("duplicate_keys", "document", TINY + "layer: ReLU\n"),
    Entry("duplicate_arg_keys", "document",
          "layer: Conv2d\nargs: {in_channels: 1, in_channels: 2, out_channels: 2, kernel_size: 3}\n"
          "input: {shape: [1, 1, 5, 5]}\n"),
    Entry("tab_indent", "document", "block:\n\t- ReLU\ninput: [2, 3]\n"),
    Entry("unclosed_flow", "document", "layer: Conv2d\nargs: {in_channels: 1\ninput: {shape: [1]}\n"),
    Entry("list_as_key", "document", "? [a, b]\n: 1\n" + TINY),
    Entry("int_key", "document", TINY + "1: 2\n"),
    Entry("null_key", "document", TINY + "~: 2\n"),
    Entry("anchor_only_no_layer", "document", "base: &base {in_channels: 1, out_channels: 2}\n"),
    Entry("merge_key_in_args", "document",
          "layer: Conv2d\nargs: {<<: {in_channels: 1, out_channels: 2}, kernel_size: 3}\ninput: {shape: [1, 1, 5, 5]}\n",
          expect=codes(0, 2)),
    Entry("many_unknown_keys", "document",
          TINY + "".join(f"k{i}: {i}\n" for i in range(200_000))),
]

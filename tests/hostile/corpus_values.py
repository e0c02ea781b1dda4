"""Hostile entries at the value level: wrong types, resource guards, seeds, imports, devices, echo.

See :mod:`tests.hostile.corpus` for what an entry is. Exit 2 is expected for everything layerlab
can refuse before running; 1 where the user's own code raises; 0 where the spec is valid and
only its echo is hostile (escape sequences, 5 MB names): then the output itself is checked.
"""

from __future__ import annotations

from tests.hostile.corpus import TINY, TINY_ARGS, Entry, codes

_CONV = f"layer: Conv2d\nargs: {TINY_ARGS}\n"
_MHA = "layer: MultiheadAttention\nargs: {embed_dim: 8, num_heads: 2, batch_first: true}\n"


def _shape(shape: str) -> str:
    return f"{_CONV}input: {{shape: {shape}}}\n"


def _arg(body: str) -> str:
    return f"layer: Conv2d\nargs: {{{body}}}\ninput: {{shape: [1, 1, 5, 5]}}\n"


def _module(body: str) -> str:
    return "import torch\nimport torch.nn as nn\n\n" + body


_IMPORTED = "layer: ./user_mod.py:Layer\ninput: {shape: [2, 3]}\n"
_ALLOW = ("--allow-import",)
_USER_CODE = codes(1, 2)  # the user's own code raised: a failed check (1) or an unbuildable spec (2)

ENTRIES = [
    # -- wrong types and values for dims and arguments ----------------------------------------------
    Entry("dims_as_strings", "wrong-type", _shape('["1", "1", "5", "5"]')),
    Entry("shape_as_text", "wrong-type", _shape('"1x1x5x5"')),
    Entry("dim_negative", "wrong-type", _shape("[1, 1, -5, 5]")),
    Entry("dim_float", "wrong-type", _shape("[1, 1, 5.5, 5]")),
    Entry("dim_bool", "wrong-type", _shape("[true, 1, 5, 5]")),
    Entry("dim_nested_list", "wrong-type", _shape("[[1], 1, 5, 5]")),
    Entry("dim_nan", "wrong-type", _shape("[1, 1, .nan, 5]")),
    Entry("dim_inf", "wrong-type", _shape("[1, 1, .inf, 5]")),
    Entry("dim_1e26", "huge-dim", _shape("[1, 1, 100000000000000000000000000, 5]")),
    Entry("dim_product_overflows_int64", "huge-dim", _shape("[4294967296, 4294967296, 4294967296]")),
    Entry("dim_zero_spatial", "wrong-type", _shape("[1, 1, 0, 5]"), expect=codes(1, 2)),
    Entry("million_dims", "huge-dim", _shape("[" + ", ".join(["1"] * 1_000_000) + "]"), expect=codes(1, 2)),
    Entry("arg_string_for_int", "wrong-type", _arg('in_channels: "one", out_channels: 2, kernel_size: 3')),
    Entry("arg_float_for_int", "wrong-type", _arg("in_channels: 1.5, out_channels: 2, kernel_size: 3")),
    Entry("arg_bool_for_int", "wrong-type", _arg("in_channels: true, out_channels: 2, kernel_size: 3")),
    # torch builds Conv2d(in_channels=0); its forward then refuses the 1-channel input: 1 is a fair verdict
    Entry("arg_zero_channels", "wrong-type", _arg("in_channels: 0, out_channels: 2, kernel_size: 3"), expect=codes(1, 2)),
    Entry("arg_negative_kernel", "wrong-type", _arg("in_channels: 1, out_channels: 2, kernel_size: -3")),
    Entry("arg_1e26_channels", "huge-dim", _arg("in_channels: 1, out_channels: 100000000000000000000000000, kernel_size: 3")),
    Entry("arg_nested_list_kernel", "wrong-type", _arg("in_channels: 1, out_channels: 2, kernel_size: [[3]]")),
    Entry("arg_typo", "unknown-key", _arg("in_channels: 1, out_channels: 2, kernal_size: 3")),
    Entry("top_key_typo", "unknown-key", TINY.replace("layer:", "layr:")),
    Entry("input_key_typo", "unknown-key", f"{_CONV}input: {{shap: [1, 1, 5, 5]}}\n"),
    Entry("unknown_layer", "unknown-key", TINY.replace("Conv2d", "Conv2")),
    Entry("layer_and_block", "wrong-type", TINY + "block: [ReLU]\n"),
    Entry("block_empty", "wrong-type", "block: []\ninput: [2, 3]\n"),
    Entry("block_item_number", "wrong-type", "block: [ReLU, 42]\ninput: [2, 3]\n"),
    Entry("inputs_as_list", "wrong-type", f"{_CONV}inputs: [[1, 1, 5, 5]]\n"),
    Entry("dtype_nonsense", "wrong-type", TINY + "dtype: float33\n"),
    Entry("dtype_integer_model", "wrong-type", TINY + "dtype: int64\n"),
    Entry("mode_typo", "wrong-type", TINY + "mode: training\n"),
    Entry("backward_string", "wrong-type", TINY + 'backward: "yes please"\n'),
    Entry("same_as_circle", "wrong-type", _MHA + "inputs: {query: {same_as: key}, key: {same_as: value}, value: {same_as: query}}\n"),
    Entry("low_above_high", "wrong-type", "layer: Embedding\nargs: {num_embeddings: 10, embedding_dim: 4}\n"
                                         "input: {shape: [2, 3], low: 9, high: 2}\n"),
    Entry("timestamp_seed", "wrong-type", TINY + "seed: 2024-01-01\n"),
    # -- repeat (issue item 2) ----------------------------------------------------------------------
    Entry("repeat_1e9", "repeat", "block:\n  - {layer: ReLU, repeat: 1000000000}\ninput: [2, 3]\n"),
    Entry("repeat_100k", "repeat", "block:\n  - {layer: Linear, args: {in_features: 3, out_features: 3}, repeat: 100000}\n"
                                   "input: [2, 3]\n"),
    Entry("repeat_nested_product", "repeat",
          "block:\n  - block:\n      - {block: [{layer: ReLU, repeat: 1000}], repeat: 1000}\n    repeat: 1000\ninput: [2, 3]\n"),
    Entry("repeat_zero", "repeat", "block:\n  - {layer: ReLU, repeat: 0}\ninput: [2, 3]\n"),
    Entry("repeat_string", "repeat", "block:\n  - {layer: ReLU, repeat: many}\ninput: [2, 3]\n"),
    # -- seeds (issue items 3 and 7) ----------------------------------------------------------------
    Entry("seed_2_63", "seed-overflow", TINY + "seed: 9223372036854775808\n"),
    Entry("seed_2_70", "seed-overflow", TINY + "seed: 1180591620717411303424\n"),
    Entry("seed_minus_one", "seed-overflow", TINY + "seed: -1\n", expect=codes(0, 2)),
    Entry("seed_float", "seed-overflow", TINY + "seed: 1.5\n"),
    Entry("cli_seed_2_63", "seed-overflow", TINY, args=("--seed", str(2**63))),
    Entry("cli_seed_minus_2_70", "seed-overflow", TINY, args=("--seed", str(-2**70))),
    Entry("cli_seed_int64_max", "seed-overflow", TINY, args=("--seed", str(2**63 - 1)), expect=codes(0, 2)),
    # -- memory estimates (issue item 10) -----------------------------------------------------------
    Entry("input_4pb", "memory", "layer: ReLU\ninput: {shape: [1048576, 1048576, 1024]}\n"),
    Entry("input_30gb", "memory", _shape("[1, 1, 90000, 90000]"), expect=codes(1, 2)),
    Entry("params_4pb", "memory", "layer: Linear\nargs: {in_features: 33554432, out_features: 33554432}\ninput: [1, 33554432]\n"),
    Entry("causal_mask_4tb", "memory", _MHA + "inputs:\n  query: {shape: [1, 4, 8]}\n  key: {same_as: query}\n"
                                              "  value: {same_as: query}\n  attn_mask: {causal: 1000000}\n"),
    Entry("activation_256gb", "memory", "layer: Upsample\nargs: {scale_factor: 100000}\ninput: {shape: [1, 1, 8, 8]}\n",
          expect=codes(1, 2)),
    # -- imports (resolve, user code) ---------------------------------------------------------------
    Entry("import_without_allow", "import", _IMPORTED, files={"user_mod.py": _module("class Layer(nn.Identity):\n    pass\n")}),
    Entry("import_stdlib_without_allow", "import", "layer: os.path:join\ninput: [1]\n"),
    Entry("import_missing_module", "import", "layer: no_such_module_xyz:Layer\ninput: [2, 3]\n", args=_ALLOW),
    Entry("import_missing_attribute", "import", _IMPORTED, args=_ALLOW,
          files={"user_mod.py": _module("class Other(nn.Identity):\n    pass\n")}),
    Entry("import_not_a_module_class", "import", "layer: collections:OrderedDict\ninput: [2, 3]\n", args=_ALLOW),
    Entry("import_raises_module_not_found", "user-code", _IMPORTED, args=_ALLOW, expect=_USER_CODE,
          files={"user_mod.py": "import a_dependency_nobody_installed\n"}),
    Entry("import_raises_zero_division", "user-code", _IMPORTED, args=_ALLOW, expect=_USER_CODE,
          files={"user_mod.py": "1 / 0\n"}),
    Entry("import_syntax_error", "user-code", _IMPORTED, args=_ALLOW, expect=_USER_CODE,
          files={"user_mod.py": "def broken(:\n"}),
    Entry("init_raises", "user-code", _IMPORTED, args=_ALLOW, expect=_USER_CODE, files={"user_mod.py": _module(
        "class Layer(nn.Module):\n    def __init__(self):\n        super().__init__()\n        raise RuntimeError('no')\n")}),
    Entry("forward_raises", "user-code", _IMPORTED, args=_ALLOW, expect=codes(1), files={"user_mod.py": _module(
        "class Layer(nn.Module):\n    def forward(self, x):\n        raise RuntimeError('boom from forward')\n")}),
    Entry("forward_raises_unprintable", "user-code", _IMPORTED, args=_ALLOW, expect=codes(1), files={"user_mod.py": _module(
        "class Bad(Exception):\n    def __str__(self):\n        raise ValueError('no str')\n\n"
        "class Layer(nn.Module):\n    def forward(self, x):\n        raise Bad()\n")}),
    Entry("forward_infinite_recursion", "user-code", _IMPORTED, args=_ALLOW, expect=codes(1), files={"user_mod.py": _module(
        "class Layer(nn.Module):\n    def forward(self, x):\n        return self.forward(x)\n")}),
    Entry("forward_allocates_1tb", "user-code", _IMPORTED, args=_ALLOW, expect=codes(1), files={"user_mod.py": _module(
        "class Layer(nn.Module):\n    def forward(self, x):\n        return x + torch.ones(2**38).sum()\n")}),
    # -- inputs and batch_dims (issue items 11 and 12) ----------------------------------------------
    Entry("input_name_typo", "input-name", _MHA + "inputs:\n  query: {shape: [1, 4, 8]}\n  key: {same_as: query}\n"
                                                 "  value: {same_as: query}\n  atn_mask: {causal: 4}\n"),
    Entry("batch_dims_out_of_range", "batch-dims", TINY + "batch_dims: {input: 7}\n"),
    Entry("batch_dims_name_typo", "batch-dims", TINY + "batch_dims: {inptu: 0}\n"),
    Entry("batch_dims_not_int", "batch-dims", TINY + "batch_dims: {input: first}\n"),
    Entry("batch_dims_scalar", "batch-dims", TINY + "batch_dims: 3\n"),
    # -- devices (issue items 8 and 9) --------------------------------------------------------------
    Entry("device_meta", "device", TINY + "device: meta\n", expect=codes(0, 1, 2)),
    Entry("device_cuda", "device", TINY + "device: cuda\n"),
    Entry("device_mps", "device", TINY + "device: mps\n"),
    Entry("device_xla", "device", TINY + "device: xla\n"),
    Entry("device_nonsense", "device", TINY + "device: gpu-please\n"),
    Entry("input_device_cuda", "device", f"{_CONV}input: {{shape: [1, 1, 5, 5], device: 'cuda:7'}}\n"),
    Entry("cli_device_mps", "device", TINY, args=("--device", "mps"), commands=("inspect", "profile", "export-check")),
    Entry("cli_device_xla", "device", TINY, args=("--device", "xla"), commands=("inspect", "profile", "export-check")),
    # -- echo: control characters and huge strings (issue item 13) ----------------------------------
    Entry("name_ansi_escape", "echo", TINY + 'name: "\\e[31mRED\\e[0m \\e]0;pwned\\a title"\n', expect=codes(0)),
    Entry("name_c1_csi_and_cr", "echo", TINY + 'name: "a\\u009b31m b\\rover\\bwrite"\n', expect=codes(0)),
    Entry("description_escape", "echo", TINY + 'description: "\\e[2J\\e[Hcleared"\n', expect=codes(0)),
    Entry("unknown_key_escape", "echo", TINY + '"\\e[31mkey": 1\n'),
    Entry("layer_name_escape", "echo", TINY.replace("Conv2d", '"\\e[31mConv2d\\e[0m"')),
    Entry("device_escape", "echo", TINY + 'device: "\\e]0;owned\\a"\n'),
    Entry("block_item_name_escape", "echo", 'block:\n  - {layer: ReLU, name: "\\e[5mblink"}\ninput: [2, 3]\n',
          expect=codes(0, 2)),
    Entry("escape_in_file_name", "echo", TINY, filename="evil\x1b[31m\x07.yaml", expect=codes(0)),
    Entry("name_5mb", "size", TINY + "name: " + "n" * (5 * 2**20) + "\n"),  # over the spec size cap
    Entry("name_600kb", "echo", TINY + "name: " + "n" * 600_000 + "\n", expect=codes(0)),
    Entry("layer_name_600kb", "echo", TINY.replace("Conv2d", "C" * 600_000)),
    Entry("input_name_600kb", "echo", f"{_CONV}inputs: {{{'i' * 600_000}: {{shape: [1, 1, 5, 5]}}}}\n",
          expect=codes(0, 2)),
    Entry("layer_name_5mb", "echo", TINY.replace("Conv2d", "C" * (5 * 2**20))),
    Entry("unknown_key_5mb", "echo", TINY + "k" * (5 * 2**20) + ": 1\n"),
    Entry("dtype_5mb", "echo", TINY + "dtype: " + "f" * (5 * 2**20) + "\n"),
    # -- options that go with a spec (issue items 3, 4, 12) -----------------------------------------
    # (--json saves no view, so there an unwritable path may be a warning and exit 0)
    Entry("svg_missing_dir", "unwritable-output", TINY, args=("--svg", "/no/such/dir/out.svg"), commands=("inspect",),
          expect_json=codes(0, 2)),
    Entry("html_in_proc", "unwritable-output", TINY, args=("--html", "/proc/layerlab.html"), commands=("inspect",),
          expect_json=codes(0, 2)),
    Entry("svg_dev_full", "unwritable-output", TINY, args=("--svg", "/dev/full"), commands=("inspect",),
          expect_json=codes(0, 2)),
    Entry("input_shape_1e20", "huge-dim", TINY, args=("--input-shape", "1,1,100000000000000000000,5"),
          commands=("inspect",)),
    Entry("threads_100000", "options", TINY, args=("--threads", "100000"), commands=("profile",)),
    Entry("rtol_nan", "options", TINY, args=("--rtol", "nan"), commands=("export-check",)),
    # -- controls: a valid spec and a genuinely broken block (exit 1) -------------------------------
    Entry("tiny_valid", "control", TINY, expect=codes(0)),
    Entry("broken_block", "control", "block:\n  - Flatten\n  - {layer: Linear, args: {in_features: 7, out_features: 2}}\n"
                                     "input: [2, 3, 4]\n", expect=codes(1)),
]

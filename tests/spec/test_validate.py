"""Spec checks before anything runs: names, arguments, types, inputs — each a SpecError naming
file:line:col, with did-you-mean where a name is close."""

import textwrap

import pytest
import torch
import torch.nn as nn

from layerlab.errors import SpecError, UsageError
from layerlab.spec import Overrides, build, load_spec, parse_spec_text, spec_from_registry


def spec(text, **kw):
    return parse_spec_text(textwrap.dedent(text), filename="t.yaml", **kw)


def error(text, **kw) -> SpecError:
    with pytest.raises(SpecError) as info:
        spec(text, **kw)
    assert info.value.exit_code == 2
    return info.value


def test_single_layer_spec_builds():
    s = spec("""
        layer: Conv2d
        args: {in_channels: 3, out_channels: 4, kernel_size: 3}
        input: {shape: [2, 3, 8, 8]}
        seed: 5
        mode: eval
    """)
    built = build(s)
    assert isinstance(built.module, nn.Conv2d) and built.module.out_channels == 4
    assert built.mode == "eval" and built.seed == 5
    x = built.kwargs["input"]
    assert x.shape == (2, 3, 8, 8) and x.requires_grad and x.dtype == torch.float32
    again = build(s)
    assert torch.equal(again.kwargs["input"], x)
    assert torch.equal(again.module.weight, built.module.weight)  # seeded init


def test_block_forms_names_nesting_and_repeat():
    s = spec("""
        block:
          - Conv2d: {in_channels: 1, out_channels: 2, kernel_size: 3}
          - relu
          - maxpool2d: {kernel_size: 2}
          - block:
              - Flatten
              - {layer: Linear, args: [18, 4]}
            name: head
          - {layer: Tanh, repeat: 2, name: acts}
        input: {shape: [1, 1, 8, 8]}
    """)
    m = build(s).module
    names = [n for n, _ in m.named_modules()]
    assert names == ["", "0", "1", "2", "head", "head.0", "head.1", "acts", "acts.0", "acts.1"]
    assert isinstance(m[1], nn.ReLU)
    assert type(m[2]).__name__ == "MaxPool2d"  # layerlab's own when registered, else torch's
    assert m.head[1].in_features == 18


def test_name_resolution_order():
    from layerlab.spec.resolve import resolve_layer

    assert resolve_layer("Conv2d", where="x").cls is nn.Conv2d
    assert resolve_layer("nn.GRU", where="x").cls is nn.GRU
    assert resolve_layer("torch.nn.TransformerEncoderLayer", where="x").cls is nn.TransformerEncoderLayer
    assert resolve_layer("batch_norm2d", where="x").cls is nn.BatchNorm2d
    assert resolve_layer("relu", where="x").cls is nn.ReLU
    from layerlab import registry

    if registry.find("conv2d") is not None:
        r = resolve_layer("conv2d", where="x")
        assert r.kind == "registry" and r.cls is not nn.Conv2d


def test_unknown_layer_with_did_you_mean():
    e = error("""
        block:
          - Conv2d: {in_channels: 1, out_channels: 2, kernel_size: 3}
          - Convv2d: {in_channels: 2, out_channels: 2, kernel_size: 3}
        input: {shape: [1, 1, 8, 8]}
    """)
    assert e.message == "unknown layer 'Convv2d'"
    assert e.where == "t.yaml:4:5"
    assert e.hint.startswith("did you mean 'Conv2d'")


def test_unknown_argument_with_did_you_mean():
    e = error("""
        layer: Conv2d
        args: {in_channels: 3, out_channel: 4, kernel_size: 3}
        input: {shape: [1, 3, 8, 8]}
    """)
    assert e.message == "nn.Conv2d has no argument 'out_channel'"
    assert e.where == "t.yaml:3:24"
    assert e.hint.startswith("did you mean 'out_channels'")


def test_unknown_rnn_argument_is_caught_too():
    e = error("""
        layer: LSTM
        args: {input_size: 3, hiden_size: 4}
        input: {shape: [5, 1, 3]}
    """)
    assert "has no argument 'hiden_size'" in e.message and "'hidden_size'" in e.hint


def test_missing_required_argument():
    e = error("""
        layer: Linear
        args: {in_features: 3}
        input: {shape: [1, 3]}
    """)
    assert e.message == "nn.Linear needs argument 'out_features'"
    assert e.where == "t.yaml:2:1"


@pytest.mark.parametrize(
    "args, words",
    [
        ("{in_channels: 3, out_channels: 4, kernel_size: '3'}", "argument kernel_size must be int or [int, int], got str '3'"),
        ("{in_channels: 3.5, out_channels: 4, kernel_size: 3}", "argument in_channels must be int, got float 3.5"),
        ("{in_channels: 3, out_channels: 4, kernel_size: 3, bias: 1}", "argument bias must be bool, got int 1"),
        ("{in_channels: 3, out_channels: 4, kernel_size: 3, padding_mode: mirror}", "padding_mode must be one of 'zeros'"),
    ],
)
def test_wrong_types(args, words):
    e = error(f"""
        layer: Conv2d
        args: {args}
        input: {{shape: [1, 3, 8, 8]}}
    """)
    assert words in e.message
    assert e.where.startswith("t.yaml:3:")


def test_constructor_rejections_are_spec_errors():
    s = spec("""
        layer: MultiheadAttention
        args: {embed_dim: 10, num_heads: 3}
        inputs: {query: [2, 1, 10], key: {same_as: query}, value: {same_as: query}}
    """)
    with pytest.raises(SpecError) as info:
        build(s)
    assert "nn.MultiheadAttention(…) rejected its arguments: embed_dim must be divisible by num_heads" in info.value.message
    assert info.value.where == "t.yaml:2:1"


def test_missing_inputs():
    e = error("""
        layer: Linear
        args: {in_features: 3, out_features: 2}
    """)
    assert e.message == "the spec gives no input for Linear"
    e = error("""
        layer: MultiheadAttention
        args: {embed_dim: 8, num_heads: 2}
        inputs:
          query: {shape: [3, 1, 8]}
          key: {same_as: query}
    """)
    assert e.message.startswith("missing input 'value' for MultiheadAttention.forward(query, key, value")
    assert e.where == "t.yaml:4:1"
    e = error("""
        layer: Linear
        args: {in_features: 3, out_features: 2}
        inputs: {x: [2, 3], y: [2, 3]}
    """)
    assert e.message == "Linear.forward(input) takes no input named 'y'"
    e = error("""
        layer: Linear
        args: {in_features: 3, out_features: 2}
        input: {dtype: float64}
    """)
    assert e.message == "input 'input' needs a shape"


@pytest.mark.parametrize(
    "text, words",
    [
        ("layer: ReLU\ninput: {shape: [2], dtyp: float64}\n", "unknown key 'dtyp' in input 'input'"),
        ("layer: ReLU\ninput: {shape: [2, x]}\n", "must be a list of integers"),
        ("layer: ReLU\ninput: {shape: [2], dtype: float65}\n", "unknown dtype 'float65'"),
        ("layer: ReLU\nimput: {shape: [2]}\n", "unknown key 'imput' in the spec"),
        ("layer: ReLU\ninput: {shape: [2]}\nmode: training\n", "mode must be 'train' or 'eval'"),
        ("layer: ReLU\ninput: {shape: [2]}\nseed: one\n", "seed must be an integer"),
        ("layer: ReLU\nblock: [Tanh]\ninput: {shape: [2]}\n", "layer: or block:, not both"),
        ("args: {}\ninput: {shape: [2]}\n", "names no layer"),
        ("- ReLU\n", "a spec must be a mapping"),
        ("block: []\ninput: {shape: [2]}\n", "block must be a non-empty list"),
        ("layer: ReLU\ninputs: {x: {same_as: y}}\n", "same_as 'y', which is not an input"),
        ("layer: ReLU\ninputs: {x: {shape: [2], low: 0}}\n", "integer ids need high"),
        ("layer: ReLU\ninputs: {x: {shape: [2], dtype: int64}}\n", "give its range with high"),
        ("layer: Linear\nargs: [2, 2]\ninputs: {input: [2, 2], extra: [1]}\n", "takes no input named 'extra'"),
        ("layer: Linear\nargs: [2, 2, true, cpu, float32, 9]\ninput: [2]\n", "takes at most 5 positional arguments"),
        ("layer: ReLU\ninputs: {a: {same_as: b}, b: {same_as: a}}\n", "goes round in a circle"),
        ("block: [{layer: ReLU, name: a.b}]\ninput: [2]\n", "may not be empty or contain '.'"),
        ("block: [{layer: ReLU, name: a}, {layer: Tanh, name: a}]\ninput: [2]\n", "two block items are named 'a'"),
    ],
)
def test_value_errors(text, words):
    with pytest.raises(SpecError) as info:
        parse_spec_text(text, filename="v.yaml")
    assert words in info.value.message, info.value.message
    assert info.value.where.startswith("v.yaml")


def test_did_you_mean_on_keys():
    e = error("""
        layer: ReLU
        input: {shape: [2]}
        devce: cpu
    """)
    assert e.hint == "did you mean 'device'?"


def test_import_path_needs_the_flag(tmp_path, monkeypatch):
    (tmp_path / "my_layers.py").write_text(
        "import torch.nn as nn\n\nclass Gate(nn.Module):\n    def __init__(self, width: int):\n"
        "        super().__init__()\n        self.lin = nn.Linear(width, width)\n\n"
        "    def forward(self, x):\n        return self.lin(x).sigmoid() * x\n"
    )
    path = tmp_path / "gate.yaml"
    path.write_text("layer: my_layers:Gate\nargs: {width: 4}\ninput: {shape: [2, 4]}\n")
    with pytest.raises(SpecError) as info:
        load_spec(str(path))
    assert "is an import path" in info.value.message and "--allow-import" in info.value.hint
    assert info.value.where.endswith("gate.yaml:1:1")
    monkeypatch.chdir(tmp_path)
    s = load_spec(str(path), allow_import=True)
    assert type(build(s).module).__name__ == "Gate"
    path.write_text("layer: my_layers.py:Gate\nargs: {width: 4, depth: 2}\ninput: {shape: [2, 4]}\n")
    with pytest.raises(SpecError, match="Gate has no argument 'depth'"):
        load_spec(str(path), allow_import=True)


def test_generated_inputs_ids_masks_and_same_as():
    s = spec("""
        layer: MultiheadAttention
        args: {embed_dim: 8, num_heads: 2, batch_first: true}
        inputs:
          query: {shape: [2, 5, 8]}
          key: {same_as: query}
          value: {same_as: key}
          key_padding_mask: {key_padding: [5, 3]}
          attn_mask: {causal: 5}
          need_weights: false
    """)
    built = build(s)
    kw = built.kwargs
    assert kw["key"] is kw["query"] and kw["value"] is kw["query"]
    assert kw["need_weights"] is False
    mask = kw["attn_mask"]
    assert torch.equal(mask, nn.Transformer.generate_square_subsequent_mask(5))
    assert kw["key_padding_mask"].dtype == torch.bool
    assert kw["key_padding_mask"].tolist() == [[False] * 5, [False] * 3 + [True] * 2]
    s = spec("""
        layer: Embedding
        args: {num_embeddings: 50, embedding_dim: 4}
        input: {shape: [3, 7], low: 10, high: 20}
    """)
    ids = build(s).kwargs["input"]
    assert ids.dtype == torch.int64 and not ids.requires_grad
    assert 10 <= ids.min() and ids.max() < 20
    s = spec("""
        layer: Identity
        inputs: {x: {causal: [2, 3], dtype: bool}}
    """)
    # "x" names no forward parameter: it fills Identity.forward(input) by position.
    assert build(s).args[0].tolist() == [[False, True, True], [False, False, True]]


def test_overrides_replace_the_spec():
    text = """
        layer: Linear
        args: {in_features: 4, out_features: 2}
        inputs: {input: {shape: [3, 4]}}
        dtype: float32
    """
    s = spec(text, overrides=Overrides(dtype="float64", seed=7, mode="eval", input_shapes=[(None, [5, 4])]))
    built = build(s)
    assert built.kwargs["input"].shape == (5, 4) and built.kwargs["input"].dtype == torch.float64
    assert built.module.weight.dtype == torch.float64
    assert built.seed == 7 and built.mode == "eval"
    with pytest.raises(UsageError, match="no input called 'x'"):
        spec(text, overrides=Overrides(input_shapes=[("x", [1, 4])]))


def test_registry_layer_with_its_defaults():
    from layerlab import registry

    if registry.find("conv2d") is None:
        pytest.skip("conv2d not registered yet")
    s = spec_from_registry("conv2d")
    assert s.root.resolved.kind == "registry" and s.inputs
    built = build(s)
    assert built.kwargs or built.args
    s = spec("layer: conv2d\n")  # a registry layer brings its default inputs
    assert s.inputs[0].where == "registry:conv2d"

"""Specs that say common things: factories, argument objects, nested / literal / file inputs,
padding-mask conventions, missing modules, no silent casts. Values are checked against real torch
(and real Hugging Face models from tiny configs, skipped without ``transformers``)."""

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

from layerlab.errors import SpecError
from layerlab.spec import build, load_spec, parse_spec_text

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def spec_in(tmp_path, text, name="s.yaml", **kw):
    path = tmp_path / name
    path.write_text(text)
    return load_spec(str(path), **kw)


def first(built):
    """The first forward argument (torch modules name it ``input``, so it is passed by keyword)."""
    return next(iter(built.inputs.values()))


# --- factories -------------------------------------------------------------------------------

def test_factory_function_builds_the_same_model_as_calling_it():
    import importlib.util

    built = build(load_spec(str(CONFIGS / "factory_mlp.yaml"), allow_import=True))
    mod_spec = importlib.util.spec_from_file_location("um_check", CONFIGS / "user_models.py")
    um = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(um)
    torch.manual_seed(0)  # the spec's seed
    expected = um.make_mlp(in_features=16, hidden=32, out_features=4, depth=2)
    assert type(built.module).__name__ == "TinyMLP"
    assert [tuple(m.weight.shape) for m in built.module if isinstance(m, nn.Linear)] == [(32, 16), (32, 32), (4, 32)]
    x = first(built).detach()
    torch.testing.assert_close(built.module(x), expected(x), rtol=0, atol=0)


def test_classmethod_factory_and_argument_did_you_mean():
    spec = parse_spec_text(f"build: {CONFIGS}/user_models.py:TinyMLP.from_sizes\nargs: {{sizes: [4, 8, 2]}}\n"
                           "input: {shape: [3, 4]}\n", allow_import=True)
    module = build(spec).module
    assert [tuple(m.weight.shape) for m in module if isinstance(m, nn.Linear)] == [(8, 4), (2, 8)]
    with pytest.raises(SpecError, match="has no argument 'hiden'") as err:
        parse_spec_text(f"build: {CONFIGS}/user_models.py:make_mlp\n"
                        "args: {in_features: 4, hiden: 8, out_features: 2}\ninput: [3, 4]\n", allow_import=True)
    assert "'hidden'" in err.value.hint


def test_factory_that_returns_no_module_is_a_clear_error(tmp_path):
    (tmp_path / "zoo.py").write_text("import torch\ndef make(n):\n    return torch.zeros(n)\nVALUE = 3\n")
    spec = spec_in(tmp_path, "build: ./zoo.py:make\nargs: {n: 3}\ninput: [2, 3]\n", allow_import=True)
    with pytest.raises(SpecError, match=r"zoo.py:make\(…\) returned torch.Tensor, not an nn.Module") as err:
        build(spec)
    assert err.value.where.endswith("s.yaml:1:1") and err.value.exit_code == 2
    with pytest.raises(SpecError, match="not an nn.Module class nor a factory: it is a int value"):
        spec_in(tmp_path, "layer: ./zoo.py:VALUE\ninput: [2, 3]\n", allow_import=True)


def test_user_code_needs_allow_import_but_torch_factories_do_not(tmp_path):
    (tmp_path / "torch.py").write_text("raise SystemExit('must not run')\n")
    with pytest.raises(SpecError, match="is an import path"):  # a file named torch.py is the user's code
        spec_in(tmp_path, "build: ./torch.py:make\ninput: [2, 3]\n")
    # torch.nn.utils.parametrizations.weight_norm is a factory taking a module: built from an object argument
    spec = parse_spec_text("build: torch.nn.utils.parametrizations:weight_norm\n"
                           "args: {module: {class: nn.Linear, args: {in_features: 4, out_features: 3}}}\n"
                           "input: [2, 4]\n")
    built = build(spec)
    torch.manual_seed(0)
    expected = torch.nn.utils.parametrizations.weight_norm(nn.Linear(4, 3))
    x = first(built).detach()
    assert hasattr(built.module, "parametrizations")
    torch.testing.assert_close(built.module(x), expected(x), rtol=0, atol=0)


def test_object_argument_keys_and_import_rule():
    with pytest.raises(SpecError, match="unknown key 'arg'") as err:
        parse_spec_text("build: torch.nn.utils.parametrizations:weight_norm\n"
                        "args: {module: {class: nn.Linear, arg: {}}}\ninput: [2, 4]\n")
    assert "did you mean 'args'" in err.value.hint
    with pytest.raises(SpecError, match="class 'mypkg:Thing' is an import path"):
        parse_spec_text("build: torch.nn.utils.parametrizations:weight_norm\n"
                        "args: {module: {class: mypkg:Thing}}\ninput: [2, 4]\n")


def test_missing_module_in_user_init_is_named_with_its_line(tmp_path):
    (tmp_path / "net.py").write_text("import torch.nn as nn\nclass Net(nn.Module):\n    def __init__(self, n: int):\n"
                                     "        super().__init__()\n        import not_installed_pkg_xyz\n")
    spec = spec_in(tmp_path, "layer: ./net.py:Net\nargs: {n: 3}\ninput: [2, 3]\n", allow_import=True)
    with pytest.raises(SpecError, match=r"failed importing 'not_installed_pkg_xyz' at .*net.py:5") as err:
        build(spec)
    assert "rejected its arguments" not in err.value.message and err.value.exit_code == 2
    assert "install 'not_installed_pkg_xyz'" in err.value.hint
    (tmp_path / "top.py").write_text("import torch\nimport also_not_installed_xyz\n")
    with pytest.raises(SpecError, match=r"importing './top.py' failed at .*top.py:2: ModuleNotFoundError"):
        spec_in(tmp_path, "layer: ./top.py:Net\ninput: [2, 3]\n", allow_import=True)


def test_model_dtype_is_kept_unless_the_spec_asks(tmp_path):
    (tmp_path / "buf.py").write_text(
        "import torch, torch.nn as nn\nclass Scaled(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.register_buffer('scale', torch.full((3,), 2.0, dtype=torch.float64))  # the user's dtype bug\n"
        "    def forward(self, x):\n        return x * self.scale\n")
    built = build(spec_in(tmp_path, "layer: ./buf.py:Scaled\ninput: [2, 3]\n", allow_import=True))
    assert built.module.scale.dtype == torch.float64  # as the user's own script would have it
    assert built.module(first(built)).dtype == torch.float64  # float32 x × float64 buffer, as in plain torch
    cast = build(spec_in(tmp_path, "layer: ./buf.py:Scaled\ndtype: float32\ninput: [2, 3]\n", allow_import=True))
    assert cast.module.scale.dtype == torch.float32


# --- inputs ----------------------------------------------------------------------------------

def test_lstm_state_tuple_is_used_as_h0_c0():
    built = build(load_spec(str(CONFIGS / "lstm_state.yaml")))
    h0, c0 = built.kwargs["hx"]
    assert type(built.kwargs["hx"]) is tuple and h0.shape == c0.shape == (2, 4, 64) and h0.requires_grad
    assert not torch.equal(h0, c0)  # two draws from the seeded generator
    lstm, x = built.module, first(built)
    out, (hn, cn) = lstm(x, (h0, c0))
    zero_out, _ = lstm(x)
    torch.testing.assert_close(out, lstm(x, (h0.detach(), c0.detach()))[0], rtol=0, atol=0)
    assert not torch.allclose(out[:, 0], zero_out[:, 0])  # the first step depends on the state given


def test_list_and_dict_containers_nest():
    spec = parse_spec_text("layer: Identity\ninput:\n  dict:\n    a: [2, 3]\n    b: {list: [{value: [1, 2]}, "
                           "{value: 7}]}\n")
    value = first(build(spec))
    assert list(value) == ["a", "b"] and value["a"].shape == (2, 3)
    assert type(value["b"]) is list and torch.equal(value["b"][0], torch.tensor([1, 2])) and value["b"][1] == 7
    with pytest.raises(SpecError, match="same_as names a top-level input"):
        parse_spec_text("layer: Identity\ninputs:\n  x: [2]\n  y: {tuple: [{same_as: x}]}\n")


def test_literal_tensors():
    spec = parse_spec_text("layer: Identity\ninputs:\n  input: {value: [[1, 0]], dtype: int64}\n")
    t = first(build(spec))
    assert torch.equal(t, torch.tensor([[1, 0]])) and t.dtype == torch.int64
    t = build(parse_spec_text("layer: Identity\ninput: {value: [[0.5, 1], [2, 3]]}\n")).inputs["input"]
    assert t.dtype == torch.float32 and t.requires_grad and t[0, 0].item() == 0.5
    t = build(parse_spec_text("layer: Identity\ninput: {value: [true, false]}\n")).inputs["input"]
    assert t.dtype == torch.bool
    assert build(parse_spec_text("layer: Identity\ninput: {value: false}\n")).inputs["input"] is False  # as before
    with pytest.raises(SpecError, match="rows have different lengths"):
        parse_spec_text("layer: Identity\ninput: {value: [[1, 2], [3]]}\n")
    with pytest.raises(SpecError, match="only floating tensors can require grad"):
        parse_spec_text("layer: Identity\ninput: {value: [1, 2], requires_grad: true}\n")


def test_literal_ids_into_embedding_pick_its_rows():
    built = build(load_spec(str(CONFIGS / "embedding_literal.yaml")))
    emb, ids = built.module, first(built)
    assert torch.equal(ids, torch.tensor([[5, 2, 7, 0], [1, 3, 0, 0]]))
    out = emb(ids)
    assert torch.equal(out[0, 1], emb.weight[2]) and torch.equal(out[1, 3], torch.zeros(8))  # padding_idx row


def test_npy_input_relative_to_the_spec_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the path is relative to the spec, not the working directory
    built = build(load_spec(str(CONFIGS / "embedding_from_file.yaml")))
    expected = torch.from_numpy(np.load(CONFIGS / "token_ids.npy"))
    assert torch.equal(first(built), expected) and first(built).dtype == torch.int64


def test_pt_input_and_file_errors(tmp_path):
    torch.save(torch.arange(6, dtype=torch.float64).reshape(2, 3), tmp_path / "x.pt")
    t = build(spec_in(tmp_path, "layer: Identity\ninput: {file: x.pt}\n")).inputs["input"]
    assert t.dtype == torch.float32 and t.requires_grad and torch.equal(t.detach(), torch.arange(6.0).reshape(2, 3))
    torch.save({"x": torch.ones(2)}, tmp_path / "d.pt")
    with pytest.raises(SpecError, match="holds a dict, not a tensor"):
        build(spec_in(tmp_path, "layer: Identity\ninput: {file: d.pt}\n"))
    torch.save(torch.nn.Linear(2, 2), tmp_path / "obj.pt")
    with pytest.raises(SpecError, match=r"refused: torch.load\(weights_only=True\)"):
        build(spec_in(tmp_path, "layer: Identity\ninput: {file: obj.pt}\n"))
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(SpecError, match=r"refused: allow_pickle=False"):
        build(spec_in(tmp_path, "layer: Identity\ninput: {file: obj.npy}\n"))
    with pytest.raises(SpecError, match="no such file .*missing.npy") as err:
        spec_in(tmp_path, "layer: Identity\ninput: {file: missing.npy}\n")
    assert err.value.where.endswith("s.yaml:2:9")
    with pytest.raises(SpecError, match="/dev/zero is not a .npy"):
        spec_in(tmp_path, "layer: Identity\ninput: {file: /dev/zero}\n")
    (tmp_path / "dir.npy").mkdir()
    with pytest.raises(SpecError, match="dir.npy is not a regular file"):
        spec_in(tmp_path, "layer: Identity\ninput: {file: dir.npy}\n")
    with pytest.raises(SpecError, match="is not a .npy or .pt file"):
        spec_in(tmp_path, "layer: Identity\ninput: {file: s.yaml}\n")


def test_padding_mask_conventions_for_torch_attention():
    text = ("layer: MultiheadAttention\nargs: {embed_dim: 8, num_heads: 2, batch_first: true}\ninputs:\n"
            "  query: [2, 5, 8]\n  key: {same_as: query}\n  value: {same_as: query}\n  key_padding_mask: {mask}\n")
    ignore = build(parse_spec_text(text.replace("{mask}", "{padding_mask: {lengths: [5, 3], convention: ignore}}")))
    expected = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    assert torch.equal(ignore.kwargs["key_padding_mask"], expected)
    old = build(parse_spec_text(text.replace("{mask}", "{key_padding: [5, 3]}")))
    assert torch.equal(old.kwargs["key_padding_mask"], expected)
    with pytest.raises(SpecError, match="is a keep mask .* bound to 'key_padding_mask'"):
        build(parse_spec_text(text.replace("{mask}", "{padding_mask: {lengths: [5, 3], convention: keep}}")))
    with pytest.raises(SpecError, match="convention: keep | ignore"):
        parse_spec_text(text.replace("{mask}", "{padding_mask: {lengths: [5, 3]}}"))


# --- Hugging Face from a config mapping ------------------------------------------------------

def test_hf_gpt2_from_config_mapping_with_padded_mask():
    transformers = pytest.importorskip("transformers", reason="Hugging Face models need the [hf] extra")
    built = build(load_spec(str(CONFIGS / "hf_gpt2_padded.yaml"), allow_import=True))
    mask = built.kwargs["attention_mask"]
    assert torch.equal(mask, torch.tensor([[1] * 7, [1] * 5 + [0] * 2])) and mask.dtype == torch.int64
    model = built.module.eval()  # mode: eval (the spec's mode is applied by the command that runs it)
    assert isinstance(model, transformers.GPT2Model) and model.config.n_layer == 2 and len(model.h) == 2
    torch.manual_seed(0)
    twin = transformers.GPT2Model(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100,
                                                          n_positions=16, bos_token_id=0, eos_token_id=0)).eval()
    ids = built.kwargs["input_ids"]
    with torch.no_grad():
        ours = model(input_ids=ids, attention_mask=mask).last_hidden_state
        theirs = twin(input_ids=ids, attention_mask=mask).last_hidden_state
        unmasked = twin(input_ids=ids).last_hidden_state
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    # GPT-2 is causal: the mask (1 = keep) changes only the two pad positions of row 1; inverted, it would
    # change the real tokens instead
    torch.testing.assert_close(ours[:, :5], unmasked[:, :5])
    assert not torch.allclose(ours[1, 5:], unmasked[1, 5:]) and torch.allclose(ours[0], unmasked[0])


def test_hf_refuses_a_torch_convention_mask_on_attention_mask():
    pytest.importorskip("transformers", reason="Hugging Face models need the [hf] extra")
    text = (CONFIGS / "hf_gpt2_padded.yaml").read_text()
    for torch_mask in ("{key_padding: [7, 5]}", "{padding_mask: {lengths: [7, 5], convention: ignore}}"):
        spec = parse_spec_text(text.replace("{padding_mask: {lengths: [7, 5], convention: keep}}", torch_mask),
                               allow_import=True)
        with pytest.raises(SpecError, match="Hugging Face reads 1 = keep, 0 = pad") as err:
            build(spec)
        assert "convention: keep" in err.value.hint


def test_hf_automodel_from_config_classmethod():
    transformers = pytest.importorskip("transformers", reason="Hugging Face models need the [hf] extra")
    spec = parse_spec_text(
        "build: transformers:AutoModel.from_config\nargs:\n  config: {class: transformers:BertConfig, args: "
        "{num_hidden_layers: 1, hidden_size: 16, num_attention_heads: 2, intermediate_size: 32, vocab_size: 50}}\n"
        "inputs: {input_ids: {shape: [2, 5], low: 0, high: 50}}\n", allow_import=True)
    built = build(spec)
    assert isinstance(built.module, transformers.BertModel) and len(built.module.encoder.layer) == 1
    assert built.module(**built.kwargs).last_hidden_state.shape == (2, 5, 16)

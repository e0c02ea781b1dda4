"""One Target for every command: building from a spec or a registry name, binding to ``forward``,
the hints for what does not exist, and the direction of the dependencies."""

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from layerlab.errors import UsageError
from layerlab.spec import Overrides
from layerlab.target import from_module, resolve
from layerlab.target.build import from_entry

ROOT = Path(__file__).resolve().parents[1]

GRADCHECK_SPEC = """\
layer: Linear
args: {in_features: 4, out_features: 3}
inputs:
  input: {shape: [5, 4]}
reference: nn.Linear
tags: [mixes_batch]
batch_dims: {input: 0}
weight_map: {weight: weight, bias: bias}
seed: 3
"""


def test_spec_with_every_command_key_builds_module_inputs_and_claims(tmp_path):
    spec = tmp_path / "lin.yaml"
    spec.write_text(GRADCHECK_SPEC)
    t = resolve(str(spec))
    assert isinstance(t.module, nn.Linear) and isinstance(t.reference, nn.Linear)
    assert t.tags == frozenset({"mixes_batch"}) and t.batch_dims == {"input": 0}
    assert t.weight_map == {"weight": "weight", "bias": "bias"}
    pos, kw = t.split()
    x = t.values()[0]
    assert [a.name for a in t.args] == ["input"] and x.shape == (5, 4)
    # the module really is what the spec says: torch's own linear on the same weights
    torch.testing.assert_close(t.module(*pos, **kw), torch.nn.functional.linear(x, t.module.weight, t.module.bias))
    # a command that does not use the reference does not build it, and reads the same module
    lean = resolve(str(spec), reference=False)
    assert lean.reference is None
    torch.testing.assert_close(lean.module.weight, t.module.weight)


def test_overrides_reach_a_registry_layer_like_a_spec():
    t = resolve("linear", overrides=Overrides(dtype="float64", mode="eval", input_shapes=[(None, [7, 16])]))
    x = t.args[0].value
    assert x.dtype == torch.float64 and x.shape[0] == 7 and t.mode == "eval" and not t.module.training
    assert all(p.dtype == torch.float64 for p in t.module.parameters())
    assert t.reference is not None and next(t.reference.parameters()).dtype == torch.float64


def test_registry_target_is_reproducible_from_its_seed():
    a, b, c = from_entry("lstm", seed=5), from_entry("lstm", seed=5), from_entry("lstm", seed=6)
    torch.testing.assert_close(a.module.weight_ih_l0, b.module.weight_ih_l0)
    torch.testing.assert_close(a.args[0].value, b.args[0].value)
    assert not torch.equal(a.module.weight_ih_l0, c.module.weight_ih_l0)


def test_from_module_binds_inputs_to_forward_signature():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    q = torch.randn(2, 5, 8)
    mask = torch.zeros(2, 5, dtype=torch.bool)
    t = from_module(mha, q, q, q, key_padding_mask=mask, name="attn")
    assert [(a.name, a.keyword) for a in t.args] == [("query", False), ("key", False), ("value", False),
                                                     ("key_padding_mask", True)]
    pos, kw = t.split()
    out, w = t.module(*pos, **kw)
    ref_out, ref_w = mha(q, q, q, key_padding_mask=mask)
    torch.testing.assert_close(out, ref_out)
    assert t.name == "attn" and t.mode == "train"


def test_from_module_binds_a_hugging_face_model_by_name():
    transformers = pytest.importorskip("transformers", reason="binding an HF model's forward needs transformers")
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 50, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0
    t = from_module(model, ids, attention_mask=mask)
    assert [a.name for a in t.args] == ["input_ids", "attention_mask"] and t.mode == "eval"
    pos, kw = t.split()
    torch.testing.assert_close(t.module(*pos, **kw).last_hidden_state,
                               model(input_ids=ids, attention_mask=mask).last_hidden_state)


def test_missing_spec_file_points_to_the_example_and_the_registry_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a folder without configs/
    with pytest.raises(UsageError, match="no such spec file: 'conv2d.yaml'") as info:
        resolve("conv2d.yaml")
    hint = info.value.hint
    suggested = re.search(r"(\S+configs/conv2d\.yaml)", hint).group(1)
    assert Path(suggested).is_file()  # the file it suggests is really there
    assert "registry layer conv2d" in hint and "layerlab list" in hint


def test_unknown_name_suggests_close_registry_names():
    with pytest.raises(UsageError, match="neither a spec file nor a layerlab registry name") as info:
        resolve("conv2f")
    assert "'conv2d'" in info.value.hint and "layerlab list" in info.value.hint


def _imports(package: str):
    for path in (ROOT / "layerlab" / package).rglob("*.py"):
        for line in path.read_text().splitlines():
            m = re.match(r"\s*(?:from|import)\s+(layerlab\.[\w.]+)", line)
            if m:
                yield path.relative_to(ROOT), m.group(1)


def test_target_sits_below_every_command_package():
    upward = [(p, m) for p, m in _imports("target")
              if m.split(".")[1] in ("checks", "deploy", "profiling", "probe", "cli")]
    assert upward == []


def test_no_command_package_borrows_the_thing_under_test_from_checks():
    borrowed = [(p, m) for pkg in ("deploy", "profiling", "probe") for p, m in _imports(pkg)
                if m in ("layerlab.checks.resolve", "layerlab.checks.targets")]
    assert borrowed == []

"""The allow-list's near misses: what a spec may still name without ``--allow-import``, built for real.

Every model is compared with the same model built directly in torch under the same seed (the
weights, and the output on the same input), so "it resolves" also means "it is the right thing".
The escapes themselves are ``tests/spec/test_spec_escapes.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from layerlab.errors import SpecError
from layerlab.spec import build, parse_spec_text
from layerlab.spec.argument_safety import LOADING_ARGUMENTS
from layerlab.spec.resolve import is_trusted, resolve_callable, resolve_layer

ROOT = Path(__file__).resolve().parents[2]


def _first(built):
    return next(iter(built.inputs.values())).detach()


def _same_model(built, direct: nn.Module) -> None:
    """The spec's model has the weights and the output of ``direct`` (built under the same seed)."""
    mine = dict(built.module.state_dict())
    theirs = dict(direct.state_dict())
    assert mine.keys() == theirs.keys()
    for name in mine:
        torch.testing.assert_close(mine[name], theirs[name], rtol=0, atol=0, msg=name)


TORCH_NN = sorted(name for name in dir(nn) if not name.startswith("_")
                  and isinstance(getattr(nn, name), type) and issubclass(getattr(nn, name), nn.Module))


def test_every_torch_nn_class_resolves_by_import_path():
    refused = []
    for name in TORCH_NN:
        cls = getattr(nn, name)
        for path in (f"torch.nn:{name}", f"{cls.__module__}:{cls.__qualname__}", f"torch:nn.{name}"):
            try:
                assert resolve_layer(path, where="t").cls is cls
            except SpecError as exc:
                refused.append((path, exc.message))
    assert len(TORCH_NN) > 100 and not refused, refused[:5]


def test_a_torch_class_by_its_home_module_builds_the_same_conv():
    spec = parse_spec_text("layer: torch.nn.modules.conv:Conv2d\nargs: {in_channels: 3, out_channels: 4, "
                           "kernel_size: 3}\ninput: [2, 3, 8, 8]\nseed: 5\n")
    built = build(spec)
    torch.manual_seed(5)
    direct = nn.Conv2d(3, 4, 3)
    _same_model(built, direct)
    torch.testing.assert_close(built.module(_first(built)), direct(_first(built)), rtol=0, atol=0)


@pytest.mark.parametrize("factory", ["torch.nn.utils:spectral_norm", "torch.nn.utils.parametrizations:spectral_norm",
                                     "torch.nn.utils.parametrizations:orthogonal", "torch.nn.utils:weight_norm"])
def test_vetted_torch_factories_build(factory):
    spec = parse_spec_text(f"build: {factory}\nargs: {{module: {{class: nn.Linear, args: {{in_features: 4, "
                           "out_features: 4}}}\ninput: [2, 4]\nmode: eval\n")
    built = build(spec)
    module_path, _, name = factory.partition(":")
    fn = getattr(__import__(module_path, fromlist=[name]), name)
    torch.manual_seed(0)
    direct = fn(nn.Linear(4, 4))
    x = _first(built)
    torch.testing.assert_close(built.module.eval()(x), direct.eval()(x), rtol=0, atol=0)


def test_layerlab_reference_layers_by_import_path():
    spec = parse_spec_text("layer: layerlab.layers:Conv2d\nargs: {in_channels: 3, out_channels: 4, kernel_size: 3}\n"
                           "input: [1, 3, 6, 6]\n")
    built = build(spec)
    from layerlab.layers import Conv2d

    torch.manual_seed(0)
    direct = Conv2d(3, 4, 3)
    assert type(built.module) is Conv2d
    _same_model(built, direct)


def test_torch_functional_losses_are_callables_not_layers():
    assert resolve_callable("torch.nn.functional:cross_entropy", where="t").cls is torch.nn.functional.cross_entropy
    assert is_trusted("torch.nn.functional:cross_entropy") and is_trusted("torch.nn:CrossEntropyLoss")
    for refused in ("torch:os.system", "torch:load", "torch.hub:load", "layerlab.spec:load_spec", "os:system",
                    "torch.nn.functional:importlib.import_module", "./torch.py:make"):
        assert not is_trusted(refused), refused  # probes and train-check losses ask is_trusted first
    with pytest.raises(SpecError, match="refused without --allow-import"):
        resolve_layer("torch.nn.functional:relu", where="t")  # a function is no layer


def test_the_flag_trusts_the_file():
    """With --allow-import the spec is the user's own script: any path resolves (nothing is called here)."""
    assert resolve_layer("torch.hub:load", where="t", allow_import=True).cls is torch.hub.load
    with pytest.raises(SpecError, match="refused without --allow-import") as err:
        resolve_layer("torch.hub:load", where="spec.yaml:1:1")
    assert err.value.where == "spec.yaml:1:1" and "pass --allow-import if you trust this file" in err.value.hint


@pytest.mark.parametrize("args", ["{weights: null}", "{pretrained: false}", "{attn_implementation: eager}",
                                  "{trust_remote_code: false}"])
def test_harmless_values_of_loading_arguments_pass_the_check(args):
    from layerlab.spec.argument_safety import check_arguments

    import yaml

    data = yaml.safe_load(args)
    check_arguments([], data, lambda *p: "t", ("args",))  # no error
    key = next(iter(data))
    assert not LOADING_ARGUMENTS[key][0](data[key])


# --- Hugging Face: model classes and configs need no flag any more --------------------------------------------

def _gpt2_config_yaml(extra: str = "") -> str:
    return ("    class: transformers:GPT2Config\n    args: {n_layer: 1, n_embd: 16, n_head: 2, vocab_size: 50, "
            f"n_positions: 8{extra}}}\n")


@pytest.mark.parametrize("layer", ["transformers:GPT2Model", "transformers.GPT2Model",
                                   "transformers.models.gpt2.modeling_gpt2:GPT2Model"])
def test_hf_model_from_a_config_without_the_flag(layer):
    transformers = pytest.importorskip("transformers", reason="needs the [hf] extra")
    spec = parse_spec_text(f"layer: {layer}\nargs:\n  config:\n{_gpt2_config_yaml()}"
                           "inputs:\n  input_ids: {shape: [2, 5], low: 0, high: 50}\nmode: eval\n")
    built = build(spec)
    torch.manual_seed(0)
    direct = transformers.GPT2Model(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50,
                                                            n_positions=8)).eval()
    _same_model(built, direct)
    ids = built.kwargs["input_ids"]
    torch.testing.assert_close(built.module.eval()(input_ids=ids).last_hidden_state,
                               direct(input_ids=ids).last_hidden_state)


def test_hf_auto_model_from_config_and_auto_config_for_model():
    transformers = pytest.importorskip("transformers", reason="needs the [hf] extra")
    spec = parse_spec_text("build: transformers:AutoModel.from_config\nargs:\n  config:\n"
                           "    class: transformers:AutoConfig.for_model\n"
                           "    args: {model_type: bert, num_hidden_layers: 1, hidden_size: 16, num_attention_heads: 2,"
                           " intermediate_size: 32, vocab_size: 40}\n"
                           "inputs:\n  input_ids: {shape: [2, 5], low: 0, high: 40}\nmode: eval\n")
    built = build(spec)
    torch.manual_seed(0)
    direct = transformers.AutoModel.from_config(transformers.AutoConfig.for_model(
        "bert", num_hidden_layers=1, hidden_size=16, num_attention_heads=2, intermediate_size=32, vocab_size=40))
    assert type(built.module) is transformers.BertModel
    _same_model(built, direct)


def test_hf_config_class_is_an_argument_not_a_layer():
    pytest.importorskip("transformers", reason="needs the [hf] extra")
    with pytest.raises(SpecError, match="a config class, not a layer"):
        parse_spec_text("layer: transformers:GPT2Config\ninput: [2, 3]\n")


def test_torchvision_builders_without_the_flag():
    torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed (layerlab never depends on it)")
    spec = parse_spec_text("build: torchvision.models:resnet18\nargs: {weights: null, num_classes: 3}\n"
                           "input: [1, 3, 32, 32]\n")
    built = build(spec)
    torch.manual_seed(0)
    _same_model(built, torchvision.models.resnet18(weights=None, num_classes=3))


def test_timm_create_model_without_the_flag():
    timm = pytest.importorskip("timm", reason="timm is not installed")
    spec = parse_spec_text("build: timm:create_model\nargs: [resnet18]\ninput: [1, 3, 32, 32]\n")
    built = build(spec)
    torch.manual_seed(0)
    _same_model(built, timm.create_model("resnet18"))


# --- the example specs ------------------------------------------------------------------------------------------

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def _names_user_code(config: Path) -> bool:
    """Does the spec name a layer of the user's own code (``./file.py:Class``)? Those need the flag, as before."""
    return re.search(r"^\s*-?\s*(layer|build|class):\s*\S*\.py:", config.read_text(), re.M) is not None


@pytest.mark.parametrize("config", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_example_spec_still_loads(config, monkeypatch):
    """Each configs/*.yaml validates (every name resolved, every argument checked) as before; the
    Hugging Face one now without the flag."""
    from layerlab.spec.load import read_spec_file
    from layerlab.spec.validate import validate

    if "transformers" in config.read_text():
        pytest.importorskip("transformers", reason="needs the [hf] extra")
    data, marks = read_spec_file(str(config))
    data = {k: v for k, v in data.items() if k in ("layer", "build", "args", "block", "input", "inputs", "seed",
                                                   "dtype", "device", "mode", "backward", "name", "description")}
    monkeypatch.chdir(config.parent)
    user_code = _names_user_code(config)
    if user_code:
        with pytest.raises(SpecError, match="is an import path"):
            validate(data, marks, base_dir=str(config.parent))
    validate(data, marks, allow_import=user_code, base_dir=str(config.parent))

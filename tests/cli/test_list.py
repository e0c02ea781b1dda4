"""``layerlab list``: the registry layers and the example specs, as tables and as JSON; and the
"see `layerlab list`" hints that point to it."""

import json
from pathlib import Path

import yaml

from layerlab import registry

ROOT = Path(__file__).resolve().parents[2]


def test_list_shows_every_registry_layer_and_example_spec(run):
    code, out, err = run("list")
    assert code == 0, out + err
    for name in registry.names():
        assert name in out
    assert "configs/conv2d.yaml" in out
    title = yaml.safe_load((ROOT / "configs" / "conv2d.yaml").read_text())["name"]
    assert title.split(" — ")[0] in out  # the spec's own name: line
    assert err == ""


def test_list_json_matches_the_registry_and_the_files(run, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, out, err = run("list", "--json")
    assert code == 0, out + err
    data = json.loads(out)
    assert [layer["name"] for layer in data["layers"]] == registry.names()
    lstm = next(layer for layer in data["layers"] if layer["name"] == "lstm")
    assert lstm["summary"] == registry.get("lstm").summary and lstm["reference"] == "torch.nn:LSTM"
    listed = {c["path"]: c["title"] for c in data["configs"]}
    on_disk = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
    assert sorted(Path(p).name for p in listed) == on_disk
    for path, title in listed.items():
        assert title == yaml.safe_load((ROOT / path).read_text()).get("name")


def test_hints_that_name_layerlab_list_point_to_a_command_that_exists(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here: the hint must find layerlab's own
    code, out, err = run("inspect", "conv2d.yaml")
    assert code == 2, out + err
    assert "no such spec file: 'conv2d.yaml'" in err and "configs/conv2d.yaml" in err
    assert "registry layer conv2d" in err and "layerlab list" in err
    code, out, err = run("export-check", "conv2f")
    assert code == 2, out + err
    assert "'conv2d'" in err and "layerlab list" in err
    code, out, _ = run("list")
    assert code == 0 and "conv2d" in out


def test_unknown_layer_name_in_a_spec_points_to_list_too(run, tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("layer: conv2e\ninput: {shape: [1, 3, 8, 8]}\n")
    code, out, err = run("inspect", str(spec))
    assert code == 2, out + err
    assert "layerlab list" in err
    code, out, _ = run("list")
    assert code == 0


def test_list_help(run):
    code, out, err = run("list", "--help")
    assert code == 0, out + err
    assert "--json" in out and "registry" in out

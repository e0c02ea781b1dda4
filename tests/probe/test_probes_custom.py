"""Custom probes from Python and from a spec's ``probes:`` section; their errors name probe and module."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

import layerlab
from layerlab.errors import SpecError, UsageError
from layerlab.probe.probes.custom import CallableProbe


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


def test_python_callable_on_every_module_and_limited_by_a_glob():
    model, x = _model(), torch.randn(5, 4)
    with torch.no_grad():
        expected = model[0](x).abs().mean().item()

    def mean_abs(module, inputs, output):
        return {"mean |out|": output.abs().mean(), "big": bool(output.abs().max() > 100)}

    report = layerlab.inspect(model, x, probes=[mean_abs])
    result = report.probe("test_python_callable_on_every_module_and_limited_by_a_glob.mean_abs")
    assert [r.path for r in result.rows] == ["0", "1", "2", ""]
    assert result.row("0").values == {"mean |out|": pytest.approx(expected), "big": 0.0}
    only = layerlab.inspect(model, x, probes=[CallableProbe(mean_abs, modules="[02]", name="m")]).probe("m")
    assert [r.path for r in only.rows] == ["0", "2"]


def test_a_probe_that_raises_or_returns_non_numbers_is_named_not_blamed_on_the_model():
    model, x = _model(), torch.randn(5, 4)

    def broken(module, inputs, output):
        return {"ratio": 1 / 0}

    with pytest.raises(UsageError, match=r"custom probe '.*broken' raised ZeroDivisionError on module 0 \(Linear\)"):
        layerlab.inspect(model, x, probes=[broken])

    def tensor(module, inputs, output):
        return {"out": output}

    with pytest.raises(UsageError, match=r"returned a non-number for 'out' on module 0 \(Linear\)") as info:
        layerlab.inspect(model, x, probes=[tensor])
    assert info.value.got == "Tensor of shape (5, 3)"
    with pytest.raises(UsageError, match="no module path matches 'encoder.*'"):
        layerlab.inspect(model, x, probes=[CallableProbe(tensor, modules="encoder.*")])


def test_spec_section_with_import_needs_allow_import(tmp_path):
    (tmp_path / "my_probes.py").write_text(textwrap.dedent("""
        def width(module, inputs, output):
            return {"width": output.shape[-1]}
    """))
    spec = tmp_path / "spec.yaml"
    spec.write_text(textwrap.dedent("""
        layer: nn.Linear
        args: {in_features: 4, out_features: 3}
        input: [2, 4]
        probes:
          - sparsity
          - {import: "my_probes.py:width", modules: "*"}
    """))
    from layerlab.probe.probes.spec import from_section
    from layerlab.target.build import from_spec

    target = from_spec(str(spec))
    with pytest.raises(SpecError, match="is an import path") as info:
        from_section(target.sections["probes"], target.marks, allow_import=False, base_dir=target.base_dir)
    assert info.value.where.startswith(str(spec) + ":7:")  # the line of the probe that imports
    probes = from_section(target.sections["probes"], target.marks, allow_import=True, base_dir=target.base_dir)
    pos, kw = target.split()
    report = layerlab.inspect(target.module, *pos, forward_kwargs=kw, probes=probes)
    assert report.probe("width").row("").values == {"width": 3.0}
    with pytest.raises(SpecError, match="unknown probe 'sparsty'"):
        from_section(["sparsty"], target.marks)
    with pytest.raises(SpecError, match="unknown key 'module'"):
        from_section([{"import": "a:b", "module": "x"}], target.marks, allow_import=True)

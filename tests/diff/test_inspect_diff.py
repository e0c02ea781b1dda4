"""layerlab.diff on two inspect reports of real torch.nn and Hugging Face models."""

import copy

import pytest

torch = pytest.importorskip("torch")

import layerlab  # noqa: E402
from layerlab.probe.probes.base import Probe, ProbeResult, ProbeRow  # noqa: E402


def mlp(hidden=16):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                               torch.nn.Tanh(), torch.nn.Linear(hidden, 4))


@pytest.fixture(scope="module")
def x():
    return torch.randn(5, 8, generator=torch.Generator().manual_seed(1))


def forward_places(d):
    return {c.where for c in d.changes if c.section == "calls" and not c.what.endswith("grad norm")}


def test_identical_runs_have_no_differences(x):
    d = layerlab.diff(layerlab.inspect(mlp(), x), layerlab.inspect(mlp(), x))
    assert not d.differs and d.changes == [] and d.origins == []
    assert d.compared["calls"] == 6 and d.compared["params"] == 6 and d.compared["numbers"] > 40


def test_one_scaled_linear_is_named_as_the_origin_and_the_only_changed_weight(x):
    after = mlp()
    with torch.no_grad():
        after[2].weight.mul_(2.0)
    d = layerlab.diff(layerlab.inspect(mlp(), x), layerlab.inspect(after, x))
    assert d.differs
    assert d.origins == ["2"]
    assert {c.where for c in d.changes if c.section == "params" and c.what == "norm"} == {"2.weight"}
    # the forward changes at 2 and downstream of it, never upstream; nothing changes shape
    assert forward_places(d) <= {"2", "3", "4", "(root)"} and "2" in forward_places(d)
    assert not any(c.what.endswith(("shape", "dtype")) for c in d.changes)
    norm = next(c for c in d.changes if c.where == "2.weight" and c.what == "norm")
    assert norm.b == pytest.approx(2 * norm.a, rel=1e-6)
    assert norm.a == pytest.approx(mlp()[2].weight.norm().item(), rel=1e-6)


def test_a_resized_layer_is_a_shape_change_at_its_origin(x):
    d = layerlab.diff(layerlab.inspect(mlp(16), x), layerlab.inspect(mlp(32), x))
    assert d.origins == ["0"]
    shape = next(c for c in d.changes if c.where == "0" and c.what == "output shape")
    assert (shape.a, shape.b) == ([5, 16], [5, 32])
    assert {c.where for c in d.changes if c.what == "shape"} == {"0.weight", "0.bias", "2.weight", "2.bias", "4.weight"}
    # structure first: every shape change is ranked before every numeric change
    kinds = [c.numeric for c in d.changes]
    assert kinds == sorted(kinds)


def test_tolerance_hides_last_bit_changes_and_zero_tolerance_shows_them(x):
    after = mlp()
    with torch.no_grad():
        after[2].weight.mul_(1 + 1e-6)
    a, b = layerlab.inspect(mlp(), x), layerlab.inspect(after, x)
    assert not layerlab.diff(a, b).differs
    strict = layerlab.diff(a, b, rtol=0, atol=0)
    assert strict.differs and "2.weight" in strict.where("params")


def test_diff_is_symmetric(x):
    after = mlp()
    with torch.no_grad():
        after[4].bias.add_(0.5)
    a, b = layerlab.inspect(mlp(), x), layerlab.inspect(after, x)
    ab, ba = layerlab.diff(a, b), layerlab.diff(b, a)
    assert sorted((c.where, c.what) for c in ab.changes) == sorted((c.where, c.what) for c in ba.changes)
    assert ab.origins == ba.origins == ["4"]


def test_a_new_warning_is_reported(x):
    dead = mlp()
    with torch.no_grad():  # a zero layer: no gradient reaches the layers before it
        dead[2].weight.zero_()
    a, b = layerlab.inspect(mlp(), x), layerlab.inspect(dead, x)
    new = [c for c in layerlab.diff(a, b).changes if c.section == "problems"]
    assert new and all(c.a is None and c.b for c in new)
    assert {p.code for p in b.problems + b.notes} - {p.code for p in a.problems + a.notes} == \
        {c.what.split()[1] for c in new}


class MeanAbs(Probe):
    """Mean |output| of every Linear: a probe that follows the protocol in probe/probes/base.py."""

    name = "mean_abs"
    title = "mean |output|"

    def attach(self, run):
        self.rows = []
        for path, m in run.named_modules:
            if isinstance(m, torch.nn.Linear):
                run.forward_hook(m, lambda mod, i, o, path=path: self.rows.append(
                    ProbeRow(path, "Linear", 1, values={"mean_abs": o.detach().abs().mean().item()})))

    def result(self, report):
        return ProbeResult(self.name, self.title, columns={"mean_abs": "mean |y|"}, rows=self.rows)


def test_probe_rows_are_compared(x):
    after = mlp()
    with torch.no_grad():
        after[4].weight.mul_(3.0)
    a = layerlab.inspect(mlp(), x, probes=[MeanAbs()])
    b = layerlab.inspect(after, x, probes=[MeanAbs()])
    probe_changes = [c for c in layerlab.diff(a, b).changes if c.section == "probes"]
    assert [c.where for c in probe_changes] == ["mean_abs: 4"]
    with torch.no_grad():
        assert probe_changes[0].a == pytest.approx(mlp()(x).abs().mean().item(), rel=1e-6)
        assert probe_changes[0].b == pytest.approx(after(x).abs().mean().item(), rel=1e-6)
    only_b = layerlab.diff(layerlab.inspect(mlp(), x), b)
    assert any("'mean_abs' ran in B only" in n for n in only_b.notes)


def test_hf_gpt2_one_block_changed_is_the_origin():
    transformers = pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=16, vocab_size=50,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    before = transformers.GPT2Model(config).eval()
    after = copy.deepcopy(before)
    with torch.no_grad():
        after.h[1].mlp.c_proj.weight.mul_(1.5)
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    d = layerlab.diff(layerlab.inspect(before, ids), layerlab.inspect(after, ids))
    assert d.origins == ["h.1.mlp.c_proj"]
    assert {c.where for c in d.changes if c.section == "params" and c.what == "norm"} == {"h.1.mlp.c_proj.weight"}
    assert not any(c.where.startswith(("h.0", "wte", "wpe")) for c in d.changes
                   if c.section == "calls" and not c.what.endswith("grad norm"))


def test_different_inputs_name_no_origin_and_say_why(x):
    d = layerlab.diff(layerlab.inspect(mlp(), x), layerlab.inspect(mlp(), 2 * x))
    assert d.differs and d.origins == []
    std = next(c for c in d.changes if c.where == "(model input) input" and c.what == "input std")
    assert std.b == pytest.approx(2 * std.a, rel=1e-6) and std.a == pytest.approx(x.std(correction=0).item(), rel=1e-6)
    assert any(n.startswith("the model's inputs differ (input)") for n in d.notes)


def test_models_of_different_structure_are_compared_call_by_call(x):
    torch.manual_seed(0)
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten())
    d = layerlab.diff(layerlab.inspect(mlp(), x), layerlab.inspect(conv, torch.randn(2, 3, 8, 8)))
    found = {(c.where, c.what): (c.a, c.b) for c in d.changes}
    assert found[("0", "class")] == ("Linear", "Conv2d")
    assert found[("1", "class")] == ("Tanh", "Flatten")
    assert found[("0", "output shape")] == ([5, 16], [2, 4, 6, 6])
    assert {w for (w, what) in found if what == "call gone"} == {"2", "3", "4"}
    assert found[("0.weight", "shape")] == ([16, 8], [4, 3, 3, 3])
    assert {w for (w, what) in found if what == "parameter gone"} == {"2.weight", "2.bias", "4.weight", "4.bias"}
    assert d.origins == [] and any("inputs differ" in n for n in d.notes)

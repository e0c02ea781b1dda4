"""The second broken-model corpus is what it claims to be, under plain torch (no layerlab involved).

Every broken model raises (in its forward, or in its loss), every hand-fixed twin runs forward and
backward with finite gradients, broken and twin share their parameter names (and, where the case
says so, the twin's state_dict loads into the broken model), every case marks its wrong line, and
each near miss's quick fix really runs and computes another model than the twin. If one of these
fails, the corpus grades nothing.
"""

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.corpora.broken_models_second.cases import CASES

IDS = [case.name for case in CASES]
FOLDER = Path(__file__).resolve().parents[1] / "corpora" / "broken_models_second"


def _run(model, inputs, loss, targets):
    torch.manual_seed(0)
    out = model(*inputs)
    return loss(out, *targets) if loss is not None else out


def _scalar(out):
    if isinstance(out, (tuple, list)):
        return sum(_scalar(o) for o in out)
    return out.float().sum()


def _built(case):
    torch.manual_seed(0)
    twin, broken = case.build_twin(), case.build_broken()
    if case.shares_weights:
        broken.load_state_dict(twin.state_dict())
    targets = case.make_targets() if case.make_targets else ()
    return twin, broken, targets


def test_the_corpus_has_fifteen_cases_with_unique_names_and_some_near_misses():
    assert len(CASES) == 15
    assert len(set(IDS)) == len(IDS)
    assert sum(case.near_miss for case in CASES) >= 5


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_broken_model_raises(case):
    _, broken, targets = _built(case)
    with pytest.raises((RuntimeError, ValueError, IndexError, TypeError)):
        _run(broken, case.make_inputs(), case.loss_broken, targets)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_twin_runs_forward_and_backward(case):
    twin, _, targets = _built(case)
    inputs = (case.make_twin_inputs or case.make_inputs)()
    _scalar(_run(twin, inputs, case.loss_twin, targets)).backward()
    grads = [p.grad for p in twin.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_broken_and_twin_share_parameter_names(case):
    twin, broken = case.build_twin(), case.build_broken()
    assert set(dict(twin.named_parameters())) == set(dict(broken.named_parameters()))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_wrong_line_is_marked(case):
    marks = [line for path in FOLDER.glob("models_*.py") for line in path.read_text().splitlines()
             if re.search(r"#\s*BUG\(%s\)" % re.escape(case.name), line)]
    assert len(marks) == 1


def _twin_out(case):
    twin, _, targets = _built(case)
    with torch.no_grad():
        return _run(twin, case.make_inputs(), case.loss_twin, targets)


def _differs(a, b):
    return a.shape != b.shape or not torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def test_near_miss_infonce_cutting_the_labels_runs_and_is_wrong():
    case = next(c for c in CASES if c.name == "infonce_views_cat_dim")
    _, broken, _ = _built(case)
    v1, v2 = case.make_inputs()
    with torch.no_grad():
        z = F.normalize(broken.embed_views(v1, v2), dim=1)
        sim = (z @ z.t() / broken.tau).masked_fill(torch.eye(len(z), dtype=torch.bool), float("-inf"))
        quick = F.cross_entropy(sim, torch.arange(len(z)).roll(1))  # labels cut to B: runs
    assert torch.isfinite(quick) and _differs(quick, _twin_out(case))


def test_near_miss_weather_a_longitude_long_weight_runs_and_is_wrong():
    case = next(c for c in CASES if c.name == "weather_lat_weights")
    twin, _, (target,) = _built(case)
    with torch.no_grad():
        pred = twin(*case.make_inputs())
        w = torch.cos(torch.deg2rad(torch.linspace(-84.375, 84.375, 32)))
        quick = ((pred - target) ** 2 * (w / w.mean())).mean()
    assert _differs(quick, _twin_out(case))


def test_near_miss_crnn_averaging_the_height_runs_and_is_wrong():
    case = next(c for c in CASES if c.name == "crnn_height_not_collapsed")
    _, broken, _ = _built(case)
    with torch.no_grad():
        seq = broken.cnn(*case.make_inputs()).mean(2).permute(2, 0, 1)
        quick = broken.fc(broken.rnn(seq)[0]).log_softmax(-1)
    assert _differs(quick, _twin_out(case))


def test_near_miss_pos2d_cropping_the_tokens_runs_and_is_wrong():
    case = next(c for c in CASES if c.name == "pos2d_square_grid")
    _, broken, _ = _built(case)
    with torch.no_grad():
        f = broken.patch(*case.make_inputs())
        h, w = broken.grid(f)
        pos = torch.cat([broken.row[:h, None].expand(h, w, -1), broken.col[None, :w].expand(h, w, -1)], -1)
        x = f.flatten(2).transpose(1, 2)[:, : h * w] + pos.reshape(h * w, -1)
        quick = broken.head((x + broken.mlp(x)).mean(1))
    assert quick.shape == _twin_out(case).shape and _differs(quick, _twin_out(case))


def test_near_miss_mobile_a_stride_one_depthwise_conv_runs_and_is_wrong():
    case = next(c for c in CASES if c.name == "mobile_residual_stride")
    _, broken, _ = _built(case)
    broken.blocks[2].dw[0].stride = (1, 1)
    with torch.no_grad():
        quick = _run(broken, case.make_inputs(), None, ())
    assert _differs(quick, _twin_out(case))


def test_near_miss_vae_broadcasting_the_reconstruction_runs_and_is_wrong():
    case = next(c for c in CASES if c.name == "vae_kl_axis")
    twin, _, (x,) = _built(case)
    with torch.no_grad():
        torch.manual_seed(0)
        recon, mu, logvar = twin(*case.make_inputs())
        kl = -0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum(0)
        quick = (((recon - x) ** 2).sum(1)[:, None] + kl).mean()
    assert _differs(quick, _twin_out(case))


def test_the_grader_grades_a_case_and_writes_its_json(tmp_path, capsys):
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("broken_models_second_grade", FOLDER / "grade.py")
    grade = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(grade)
    out = tmp_path / "grade.json"
    assert grade.main(["--case", "vae_kl_axis", "--json", str(out)]) == 0
    record = json.loads(out.read_text())["cases"][0]
    assert record["case"] == "vae_kl_axis" and record["marked_lines"] == ["models_science.py:121"]
    for key in ("located", "first_fix_right", "dangerous", "false_verified", "no_diagnosis"):
        assert isinstance(record[key], bool)
    assert "totals (of 1)" in capsys.readouterr().out

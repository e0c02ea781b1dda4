"""The gradient-flow chart: the numbers it draws are torch's own gradients, norms and stds."""

import copy
import math

import pytest

matplotlib = pytest.importorskip("matplotlib", reason="the [plot] extra (matplotlib) is not installed")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import layerlab  # noqa: E402
from layerlab.errors import UsageError  # noqa: E402
from layerlab.plot import gradient_flow  # noqa: E402


def _loss(out):
    return out.pow(2).sum()


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))


def _torch_truth(model, x):
    """Per Linear: ‖grad of weight and bias together‖, ‖weight and bias‖, output std — from torch alone."""
    twin = copy.deepcopy(model)
    outs = {}
    hooks = [m.register_forward_hook(lambda m, i, o, name=name: outs.__setitem__(name, o.detach()))
             for name, m in twin.named_children() if isinstance(m, nn.Linear)]
    _loss(twin(x)).backward()
    for h in hooks:
        h.remove()
    truth = {}
    for name, m in twin.named_children():
        if isinstance(m, nn.Linear):
            grad = torch.cat([m.weight.grad.flatten(), m.bias.grad.flatten()]).norm().item()
            weight = torch.cat([m.weight.detach().flatten(), m.bias.detach().flatten()]).norm().item()
            truth[name] = (grad, weight, outs[name])
    return truth


def _lines(fig, prefix):
    return {line.get_gid(): line for ax in fig.axes for line in ax.get_lines()
            if (line.get_gid() or "").startswith(prefix)}


def test_plotted_numbers_are_torchs_gradient_and_weight_norms():
    model, x = _mlp(), torch.randn(32, 8)
    report = layerlab.inspect(model, x, loss=_loss)
    truth = _torch_truth(model, x)
    fig = gradient_flow(report)

    assert len(fig.axes) == 3
    titles = [ax.get_title() for ax in fig.axes]
    assert "gradient norm" in titles[0] and titles[0].startswith("Sequential")
    assert "weight norm" in titles[1] and "std" in titles[2]
    assert [ax.get_yscale() for ax in fig.axes] == ["log", "log", "linear"]
    # the three Linear layers (0, 2, 4) are one role, "* (Linear)": one series per row
    grad, = _lines(fig, "grad:0:").values()
    weight, = _lines(fig, "weight:0:").values()
    std, = _lines(fig, "std:0:").values()
    assert grad.get_gid() == "grad:0:N_Linear" and grad.get_label() == "* (Linear)"
    assert list(grad.get_xdata()) == [0, 1, 2]
    assert grad.get_ydata() == pytest.approx([truth[n][0] for n in ("0", "2", "4")], rel=1e-5)
    assert weight.get_ydata() == pytest.approx([truth[n][1] for n in ("0", "2", "4")], rel=1e-5)
    stds = [truth[n][2].std(correction=0).item() for n in ("0", "2", "4")]
    assert std.get_ydata() == pytest.approx(stds, rel=1e-4)  # the report's std is the population std
    # and the x axis names the layers in execution order
    assert [t.get_text() for t in fig.axes[2].get_xticklabels()] == ["0", "2", "4"]


def test_two_reports_side_by_side_with_their_labels_and_one_series_per_layer_group():
    torch.manual_seed(0)
    pre = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=True)
    post = copy.deepcopy(pre)
    post.norm_first = False
    x = torch.randn(2, 5, 16)
    reports = [layerlab.inspect(m, x, loss=_loss, mode="eval") for m in (pre, post)]
    fig = gradient_flow(*reports, labels=["pre-LN", "post-LN"])

    assert len(fig.axes) == 6  # 3 rows x 2 columns
    top = [ax for ax in fig.axes if "gradient norm" in ax.get_title()]
    assert [ax.get_title().splitlines()[0] for ax in top] == ["pre-LN", "post-LN"]
    assert top[0].get_shared_y_axes().joined(top[0], top[1])  # the same y range: the runs compare directly
    groups = {"self_attn_MultiheadAttention", "norm1_LayerNorm", "norm2_LayerNorm", "linear1_Linear",
              "linear2_Linear"}
    for col in (0, 1):
        assert {gid.split(":", 2)[2] for gid in _lines(fig, f"grad:{col}:")} == groups
    # the attention's point covers out_proj too (it runs as a function, not as a module): torch's numbers
    twin = copy.deepcopy(post).eval()
    _loss(twin(x)).backward()
    attn = twin.self_attn
    expected = torch.cat([p.grad.flatten() for p in (attn.in_proj_weight, attn.in_proj_bias, attn.out_proj.weight,
                                                       attn.out_proj.bias)]).norm().item()
    line = _lines(fig, "grad:1:self_attn_MultiheadAttention")["grad:1:self_attn_MultiheadAttention"]
    assert line.get_ydata()[0] == pytest.approx(expected, rel=1e-5)
    # post-LN runs the attention first, pre-LN its norm1
    assert fig.axes[4].get_xticklabels()[0].get_text() == "norm1"
    assert fig.axes[5].get_xticklabels()[0].get_text() == "self_attn"


def test_block_outputs_of_a_stack_are_the_residual_stream():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=True)
    stack = nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False)
    x = torch.randn(2, 5, 16)
    report = layerlab.inspect(stack, x, loss=_loss)
    fig = gradient_flow(report)
    blocks = _lines(fig, "std:0:block_")["std:0:block_layers.N"]
    outs = []
    hooks = [block.register_forward_hook(lambda m, i, o: outs.append(o.detach().std(correction=0).item())) for block in stack.layers]
    with torch.no_grad():
        stack(x)
    for h in hooks:
        h.remove()
    assert blocks.get_ydata() == pytest.approx(outs, rel=1e-3)
    assert outs[2] > outs[0]  # pre-LN: the residual stream grows with depth (what the line is for)


def test_without_backward_the_gradient_row_says_so():
    report = layerlab.inspect(_mlp(), torch.randn(4, 8), backward=False)
    fig = gradient_flow(report)
    assert not _lines(fig, "grad:")
    assert _lines(fig, "weight:0:")
    assert any("no backward pass ran" in t.get_text() for t in fig.axes[0].texts)


def test_svg_is_reproducible_and_names_its_series(tmp_path):
    report = layerlab.inspect(_mlp(), torch.randn(4, 8), loss=_loss)
    a, b = tmp_path / "a.svg", tmp_path / "b.svg"
    gradient_flow(report, path=a)
    gradient_flow(report, path=b)
    text = a.read_text()
    assert a.read_bytes() == b.read_bytes()
    assert "<dc:date>" not in text
    assert 'id="grad:0:N_Linear"' in text and 'id="std:0:N_Linear"' in text
    assert "gradient norm" in text  # titles are text, not glyph paths


def test_png_decodes_to_the_figure_size(tmp_path):
    from matplotlib.image import imread

    report = layerlab.inspect(_mlp(), torch.randn(4, 8), loss=_loss)
    path = tmp_path / "flow.png"
    fig = gradient_flow(report, path=path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (round(fig.get_figwidth() * 100), round(fig.get_figheight() * 100))
    pixels = imread(path)
    assert pixels.shape[:2] == (height, width) and pixels.min() < 0.5 < pixels.max()  # something was drawn


def test_other_suffix_is_refused_before_drawing(tmp_path):
    report = layerlab.inspect(_mlp(), torch.randn(4, 8))
    with pytest.raises(UsageError, match="cannot tell the picture's format") as info:
        gradient_flow(report, path=tmp_path / "flow.jpg")
    assert info.value.expected == ".svg or .png"
    assert not (tmp_path / "flow.jpg").exists()


def test_a_model_without_parameters_has_nothing_to_draw():
    report = layerlab.inspect(nn.ReLU(), torch.randn(4, 8, requires_grad=True))
    with pytest.raises(UsageError, match="nothing to draw: ReLU has no layer with parameters"):
        gradient_flow(report)


def test_drawing_leaves_pyplot_and_rcparams_alone():
    before = dict(matplotlib.rcParams)
    gradient_flow(layerlab.inspect(_mlp(), torch.randn(4, 8)))
    after = dict(matplotlib.rcParams)
    assert {k for k in before if before[k] != after[k] and not (isinstance(before[k], float)
                                                                 and math.isnan(before[k]))} == set()
    import sys

    if "matplotlib.pyplot" in sys.modules:
        assert sys.modules["matplotlib.pyplot"].get_fignums() == []


def _labelled_ticks(ax):
    lo, hi = ax.get_ylim()
    ax.figure.canvas.draw()  # tick labels are made when drawn
    return {t.get_text(): v for t, v in zip(ax.get_yticklabels(), ax.get_yticks()) if lo <= v <= hi and t.get_text()}


def test_a_vanishing_gradient_over_eight_decades_has_labelled_ticks(tmp_path):
    # ten Linear → Sigmoid: ‖∂L/∂w‖ falls from ~1 to ~1e-8 (each sigmoid passes ≤ 1/4 of the gradient);
    # matplotlib's LogLocator with subs (1, 2, 5) drew no labelled tick at all on such an axis
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(10) for m in (nn.Linear(32, 32), nn.Sigmoid())], nn.Linear(32, 2))
    report = layerlab.inspect(model, torch.randn(64, 32))
    fig = gradient_flow(report, path=tmp_path / "flow.png")
    grad, = _lines(fig, "grad:0:").values()
    first, last = grad.get_ydata()[0], grad.get_ydata()[-1]
    assert last / first > 1e6  # the picture is of a real vanishing gradient
    ticks = _labelled_ticks(fig.axes[0])
    assert len(ticks) >= 4 and all(math.log10(v) == round(math.log10(v)) for v in ticks.values())
    assert min(ticks.values()) <= 100 * first and max(ticks.values()) >= last / 100  # a tick every 2 decades
    # a narrow range (the weight norms here: all about 2.7 but the last) still gets plain labels
    for ax in fig.axes[:2]:
        assert len(_labelled_ticks(ax)) >= 2

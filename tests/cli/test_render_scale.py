"""Output at real scale: a 12-block transformer at --depth 2 in ≤ 60 lines at 100 columns
(Parameters included), containers (ModuleList) shown as their own level, identical blocks folded,
and at 80 columns no number ever cut. Models: torch's own TransformerEncoder and Hugging Face
BERT/GPT-2 built from tiny 12-layer configs (no download)."""

import math
import re

import pytest
import torch
from rich.cells import cell_len
from torch import nn

import layerlab
from layerlab.cli.render_inspect_forward import num, stat

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:[.,]\d+)*(?:e-?\d+)?%?")


def _hf_model(kind: str):
    transformers = pytest.importorskip("transformers", reason="Hugging Face models need the [hf] extra")
    if kind == "bert":
        config = transformers.BertConfig(hidden_size=32, num_hidden_layers=12, num_attention_heads=2,
                                         intermediate_size=64, vocab_size=100, max_position_embeddings=64)
        return transformers.BertModel(config)
    config = transformers.GPT2Config(n_embd=32, n_layer=12, n_head=2, vocab_size=100, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2Model(config)


@pytest.fixture(scope="module")
def bert():
    torch.manual_seed(0)
    model = _hf_model("bert")
    return model, layerlab.inspect(model, torch.randint(0, 100, (2, 8)))


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    model = _hf_model("gpt2")
    return model, layerlab.inspect(model, torch.randint(0, 100, (2, 8)))


@pytest.fixture(scope="module")
def encoder():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=2, dim_feedforward=64, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=12, enable_nested_tensor=False)
    return model, layerlab.inspect(model, torch.randn(2, 8, 32))


def _line(text: str, needle: str) -> str:
    found = [line for line in text.splitlines() if needle in line]
    assert found, f"{needle!r} not in:\n{text}"
    return found[0]


@pytest.mark.parametrize("which", ["bert", "encoder"])
def test_a_12_block_transformer_at_depth_2_fits_in_60_lines_at_100_columns(which, request):
    model, report = request.getfixturevalue(which)
    text = layerlab.render(report, width=100, depth=2)
    lines = text.rstrip("\n").splitlines()
    assert len(lines) + 1 <= 60, text  # + the CLI's title line
    assert all(cell_len(line.rstrip()) <= 100 for line in lines), text
    assert "Parameters" in text and "Backward" in text and "Summary" in text
    blocks = "layer.0–11" if which == "bert" else "layers.0–11"
    cls = "BertLayer" if which == "bert" else "TransformerEncoderLayer"
    assert f"{blocks} {cls} ×12" in _line(text, f"{cls} ×12"), text  # forward (and backward) fold
    assert len(lines) < 0.25 * len(layerlab.render(report, width=100).splitlines())  # unfolded: 4× more


def test_a_folded_parameter_row_holds_the_exact_norm_of_its_tensors(bert):
    model, report = bert
    text = layerlab.render(report, width=100, depth=2)
    row = _line(text, "encoder.layer.0–11 ×12")
    blocks = [p for name, p in model.named_parameters() if name.startswith("encoder.layer.")]
    assert "16 tensors each" in row and len(blocks) == 12 * 16
    whole = torch.cat([p.detach().flatten() for p in blocks]).double().norm().item()
    assert num(whole) in row.split(), (num(whole), row)
    # the per-parameter rows are gone; the embeddings (a module at depth 2) keep theirs
    assert "encoder.layer.3.attention.self.query.weight" not in text
    assert "word_embeddings.weight" in _line(text, "(100, 32)")


def test_an_uncalled_module_list_is_a_level_of_its_own(gpt2):
    _, report = gpt2
    full = layerlab.render(report, width=120)
    drop, container = _line(full, "drop Dropout").index("drop"), _line(full, "h 12 × GPT2Block").index("h 12")
    assert container == drop  # h is drop's sibling …
    assert _line(full, "h.0 GPT2Block").index("h.0") > container  # … and h.0 sits under h, not under drop
    folded = layerlab.render(report, width=100, depth=2)
    for table in (folded.split("Backward")[0], folded.split("Backward")[1].split("Parameters")[0]):
        assert _line(table, "h.0–11").index("h.0") == _line(table, "drop Dropout").index("drop"), table
        assert "×12" in _line(table, "h.0–11")
    assert "h 12 × GPT2Block" not in folded  # the fold stands for the container


def test_a_fold_spans_the_stack_first_input_last_output(gpt2):
    _, report = gpt2
    text = layerlab.render(report, width=100, depth=2)
    row = _line(text.split("Backward")[0], "h.0–11")
    last = report.call("h.11").tensor_outputs[0].stats
    assert [stat(last.mean), stat(last.std), stat(last.min), stat(last.max)] == row.split()[-5:-1]


@pytest.mark.parametrize("which", ["bert", "gpt2", "encoder"])
@pytest.mark.parametrize("depth", [None, 2])
def test_at_80_columns_no_number_is_cut(which, depth, request):
    _, report = request.getfixturevalue(which)
    text = layerlab.render(report, width=80, depth=depth)
    lines = text.splitlines()
    assert all(cell_len(line.rstrip()) <= 80 for line in lines), text
    cut = [t for line in lines for t in line.split() if "…" in t and _NUMBER.fullmatch(t.replace("…", ""))]
    assert not cut, text
    forward = text.split("Backward")[0]
    assert all(h in forward.split() for h in ("mean", "std", "min", "max")), forward
    # every statistic of every top-level call is printed whole
    tokens = set(_NUMBER.findall(forward))
    for call in report.calls:
        if call.depth <= 1 and call.tensor_outputs and call.tensor_outputs[0].stats is not None:
            s = call.tensor_outputs[0].stats
            for value in (s.mean, s.std, s.min, s.max):
                assert stat(value) in tokens, (call.path, stat(value))


def test_a_block_with_nan_is_never_folded_away():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(6)])
    with torch.no_grad():
        model[4][0].weight[0, 0] = math.nan
    report = layerlab.inspect(model, torch.randn(3, 8), backward=False)  # backward would spread NaN to all
    text = layerlab.render(report, width=100, depth=1)
    forward = text.split("Summary")[0]
    assert "0–3 Sequential ×4" in forward  # the clean blocks before it fold …
    assert re.search(r"\b4 Sequential\b", forward) and "NaN" in _line(forward, "4 Sequential")  # … it does not
    assert "5 Sequential" in forward


def test_no_fold_without_depth():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(5)])
    text = layerlab.render(layerlab.inspect(model, torch.randn(2, 4)), width=100)
    assert "×" not in text.split("Summary")[0]
    assert all(f"{i} Linear" in text for i in range(5))


def test_problems_lead_grouped_by_cause():
    torch.manual_seed(0)

    class Unused(nn.Module):  # three parameters that never see a gradient: one cause, three places
        def __init__(self):
            super().__init__()
            self.used = nn.Linear(4, 4)
            self.spare = nn.ModuleList(nn.Linear(4, 4, bias=False) for _ in range(3))

        def forward(self, x):
            return self.used(x)

    report = layerlab.inspect(Unused(), torch.randn(2, 4))
    codes = [p.code for p in report.warnings]
    assert codes.count("no-grad") == 3, report.problems
    text = layerlab.render(report, width=100)
    assert text.index("Problems") < text.index("Forward")
    assert "no-grad ×3" in text and text.count("no-grad ×3") == 1
    assert "spare.1.weight" in _line(text, "also at:")

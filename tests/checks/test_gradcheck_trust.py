"""The numerical gradient check's verdicts can be trusted: float32 islands, NaN, big models, seeds."""

import pytest
import torch
from torch import nn

from layerlab.checks.case import Arg, Case
from layerlab.checks.numgrad import GradcheckOptions, gradcheck
from layerlab.checks.report import Status
from layerlab.checks.run import verify


def _llama():
    tr = pytest.importorskip("transformers", reason="Hugging Face models are the stock layers with float32 casts")
    cfg = tr.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=100, max_position_embeddings=64)
    return tr.LlamaModel(cfg).eval()


def _t5():
    tr = pytest.importorskip("transformers", reason="Hugging Face models are the stock layers with float32 casts")
    return tr.T5EncoderModel(tr.T5Config(d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=1,
                                         vocab_size=100)).eval()


def _ids():
    return torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("build, source", [(_llama, "modeling_llama.py"), (_t5, "modeling_t5.py")])
@pytest.mark.parametrize("seed", [0, 1])
def test_stock_models_with_float32_norms_pass_and_say_so(build, source, seed):
    torch.manual_seed(seed)
    c = verify(build(), _ids(), only=["gradcheck"], seed=seed).check("gradcheck")
    assert c.status == Status.PASS, c.summary
    assert "float32" in c.summary and source in c.summary
    low = c.details["low_precision"]
    assert low["dtype"] == "float32"
    ops = {(o["op"], o["dtype"]) for o in low["ops"]}
    assert ("to", "float32") in ops and ("rsqrt", "float32") in ops  # the RMSNorm's cast and its variance
    assert all(source in o["source"] for o in low["ops"])
    assert c.details["eps"] == 1e-3  # a 1e-6 step is lost in float32 rounding
    assert len(c.details["checked"]) == len(list(build().parameters()))


class _DoubledSiLU(torch.autograd.Function):
    """SiLU whose backward returns twice the gradient (a planted bug)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return nn.functional.silu(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return 2 * g * s * (1 + x * (1 - s))


class _BadAct(nn.Module):
    def forward(self, x):
        return _DoubledSiLU.apply(x)


@pytest.mark.parametrize("seed", [0, 1])
def test_wrong_custom_backward_inside_float32_islands_still_fails(seed):
    torch.manual_seed(seed)
    model = _llama()
    model.layers[0].mlp.act_fn = _BadAct()
    c = verify(model, _ids(), only=["gradcheck"], seed=seed).check("gradcheck")
    assert c.status == Status.FAIL, c.summary
    wrong = c.where.split(", ")
    assert "layers.0.mlp.gate_proj.weight" in wrong  # its gradient passes only through the bad SiLU
    # up_proj and down_proj get their gradient around the SiLU's backward, norm.weight after it
    assert not {"layers.0.mlp.up_proj.weight", "layers.0.mlp.down_proj.weight", "norm.weight"} & set(wrong)
    assert "not rounding noise" in c.summary and "float32" in c.summary
    worst = [r for r in c.details["directional"] if r["tensor"] == "layers.0.mlp.gate_proj.weight"][0]
    assert worst["ratio"] == pytest.approx(2.0, rel=0.05)  # the doubled factor, measured at two steps
    assert worst["numerical_4eps"] == pytest.approx(worst["numerical"], rel=0.05)


def test_float64_layer_keeps_the_tight_check():
    c = verify(nn.Linear(5, 3), torch.randn(4, 5), only=["gradcheck"]).check("gradcheck")
    assert c.status == Status.PASS
    assert "low_precision" not in c.details and c.details["eps"] == 1e-6


def test_nan_output_is_reported_as_nan():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 3, 8)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    mask[1] = True  # every key of sample 1 masked: its softmax row is 0/0
    reference = mha(x, x, x, key_padding_mask=mask)[0]
    assert torch.isnan(reference[1]).all() and torch.isfinite(reference[0]).all()
    c = verify(mha, x, x, x, key_padding_mask=mask, only=["gradcheck"]).check("gradcheck")
    assert c.status == Status.FAIL
    assert "NaN" in c.summary and "reentrant" not in c.summary and "wrong gradient" not in c.summary
    assert c.where == "output[0]"
    assert c.details["nonfinite_outputs"][0]["nan"] == reference.isnan().sum().item() == 24


class _WhereSqrt(nn.Module):
    """sqrt where positive, else 0: finite forward, NaN backward from the branch not taken."""

    def forward(self, x):
        return torch.where(x > 0, torch.sqrt(x), torch.zeros_like(x))


def test_nan_gradient_is_reported_as_nan():
    x = torch.tensor([[1.0, -1.0, 4.0], [-2.0, 9.0, 0.5]])
    out = _WhereSqrt()(x.requires_grad_(True))
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert torch.isfinite(out).all() and torch.isnan(grad).sum() == 2  # real torch does this
    c = verify(_WhereSqrt(), x.detach(), only=["gradcheck"]).check("gradcheck")
    assert c.status == Status.FAIL
    assert "NaN" in c.summary and "reentrant" not in c.summary and "wrong gradient" not in c.summary
    assert c.where == "x" and c.details["nonfinite_gradients"][0]["nan"] == 2


def test_nan_input_is_a_skip_that_says_nan():
    x = torch.randn(3, 4)
    x[0, 0] = float("nan")
    c = verify(nn.Linear(4, 2), x, only=["gradcheck"]).check("gradcheck")
    assert c.status == Status.SKIP and "NaN" in c.summary and c.where == "input"


class _HalfGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.t()

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, 0.5 * g.t() @ x


class _Custom(nn.Linear):
    def forward(self, x):
        return _HalfGrad.apply(x, self.weight)


def _deep_stack():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(8, 8) for _ in range(10)], _Custom(8, 8, bias=False))


def test_over_budget_samples_tensors_but_always_checks_custom_functions():
    calls = []
    opts = type("Opts", (), {"gradcheck": GradcheckOptions(budget=1, min_tensors=4, max_entries=16,
                                                           progress=lambda *a: calls.append(a))})()
    case = Case(module=_deep_stack(), args=[Arg("input", torch.randn(3, 8))], target="stack")
    c = gradcheck(case, opts)
    cov = c.details["coverage"]
    assert cov["sampled"] and cov["tensors_total"] == 22 and cov["tensors_checked"] == 4
    assert cov["not_checked_count"] == 18 and len(cov["not_checked"]) == 18
    assert cov["behind_custom_function"] == ["10.weight"]
    checked = [x["name"] for x in c.details["checked"]]
    assert "input" in checked and "10.weight" in checked
    assert all(x["entries"] <= 16 for x in c.details["checked"])
    assert c.status == Status.FAIL and c.where == "10.weight"
    assert [a[1:] for a in calls] == [(i, 4) for i in range(4)] + [(4, 4)]
    assert calls[0][0] == "gradcheck input"


def test_under_budget_checks_every_tensor():
    c = verify(_deep_stack(), torch.randn(3, 8), only=["gradcheck"]).check("gradcheck")
    assert c.details["coverage"]["sampled"] is False and len(c.details["checked"]) == 22
    assert c.status == Status.FAIL and c.where == "10.weight"


def test_largest_seed_does_not_overflow():
    c = verify(nn.Linear(4, 3), torch.randn(2, 4), only=["gradcheck"], seed=2**63 - 1).check("gradcheck")
    assert c.status == Status.PASS, c.summary

"""Models whose kernels refuse float64 (transformers' MoE experts call ``torch._grouped_mm``) are checked in float32.

gradcheck, batch independence / consistency, causality and reference parity fall back to float32 with
tolerances widened by the rounding measured on the model, and every summary says so, naming the
module that refused. The checks still find planted bugs at that tolerance. Truth: plain torch
(float64 raises; replacing one sample or a later position moves what it must not).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerlab
from layerlab.checks.exact_dtype import ROUNDING_SAFETY
from layerlab.checks.report import Status

T = 6
EXACT = ["gradcheck", "batch_independence", "batch_consistency", "causality"]
COMMON = dict(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=2, max_position_embeddings=32, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _moe(kind: str):
    tf = pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")
    torch.manual_seed(0)
    if kind == "mixtral":
        model = tf.MixtralModel(tf.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **COMMON))
    else:
        model = tf.OlmoeModel(tf.OlmoeConfig(num_experts=4, num_experts_per_tok=2, **COMMON))
    return model.eval(), torch.randint(3, 50, (2, T))


def _refuses_float64(model, ids) -> bool:
    import copy

    try:
        with torch.no_grad():
            copy.deepcopy(model).double()(input_ids=ids)
    except RuntimeError:
        return True
    return False


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mixtral", "olmoe"])
def test_moe_runs_the_exact_checks_in_float32_and_says_why(kind):
    model, ids = _moe(kind)
    assert _refuses_float64(model, ids)  # truth: the expert kernel has no float64
    report = layerlab.verify(model, input_ids=ids, only=EXACT)
    by = {c.name: c for c in report.checks}
    assert report.ok, [(c.name, c.summary) for c in report.checks]
    for name in EXACT:
        c = by[name]
        assert c.status == Status.PASS, (name, c.summary)
        assert "ran in float32: this model's `layers.0.mlp.experts`" in c.summary, (name, c.summary)
        assert "refuses float64 (grouped_mm" in c.summary
        assert "batched along" not in c.summary  # the cause is the dtype, not the batch dims
    precision = by["batch_independence"].details["precision"]
    # the tolerance is the measured rounding times the safety factor, and the rounding is float32-sized
    assert torch.finfo(torch.float32).eps <= precision["rounding"] < 1e-4
    assert precision["relative_tolerance"] == pytest.approx(ROUNDING_SAFETY * precision["rounding"])
    assert by["gradcheck"].details["dtype"] == "float32"


class _MixesBatch(nn.Module):
    """Mixtral whose hidden states get the batch mean added: sample 0 reads sample 1."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        h = self.model(input_ids=input_ids).last_hidden_state
        return h + 0.1 * h.mean(0, keepdim=True)


@pytest.mark.slow
def test_float32_fallback_still_finds_a_batch_leak():
    model, ids = _moe("mixtral")
    planted = _MixesBatch(model)
    with torch.no_grad():  # truth: changing sample 1 moves sample 0
        ids2 = ids.clone()
        ids2[1] = (ids2[1] + 5) % 50
        assert float((planted(ids2) - planted(ids))[0].abs().max()) > 1e-3
    c = layerlab.verify(planted, input_ids=ids, only=["batch_independence"]).checks[0]
    assert c.status == Status.FAIL, c.summary
    assert c.details["precision"]["dtype"] == "float32"


@pytest.mark.slow
def test_float32_fallback_still_finds_a_causal_leak():
    model, ids = _moe("mixtral")
    allowed = torch.ones(T, T, dtype=torch.bool).tril(1)  # position t sees t + 1
    leaky = torch.zeros(2, 1, T, T).masked_fill(~allowed, float("-inf"))
    with torch.no_grad():  # truth
        ids2 = ids.clone()
        ids2[:, 1] = (ids2[:, 1] + 5) % 50
        moved = model(input_ids=ids2, attention_mask=leaky).last_hidden_state - \
            model(input_ids=ids, attention_mask=leaky).last_hidden_state
        assert float(moved[:, 0].abs().max()) > 1e-3
    c = layerlab.verify(model, input_ids=ids, attention_mask=leaky, only=["causality"]).checks[0]
    assert c.status == Status.FAIL, c.summary
    assert (c.details["first_leaking_position"], c.details["leaks_from"]) == (0, 1)
    assert "ran in float32" in c.summary


def test_a_float64_layer_stays_in_float64():
    torch.manual_seed(0)
    c = layerlab.verify(nn.Linear(4, 3), torch.randn(3, 4), only=["batch_independence"]).checks[0]
    assert c.status == Status.PASS and c.details["dtype"] == "float64" and "float32" not in c.summary


class _OwnFloat32(nn.Module):
    """Near miss: the layer's own code refuses float64 (a float32 weight it multiplies by): its failure."""

    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randn(4, 3), persistent=False)

    def forward(self, x):
        return x @ self.w.float()


def test_the_layers_own_float64_raise_is_not_a_fallback():
    from layerlab.checks.case import Case, Arg
    from layerlab.checks.exact_dtype import exact_dtype

    torch.manual_seed(0)
    case = Case(module=_OwnFloat32(), args=[Arg("x", torch.randn(3, 4), False)], target="own")
    assert exact_dtype(case).dtype == torch.float64


@pytest.mark.slow
def test_reference_parity_runs_in_float32_too():
    import copy

    model, ids = _moe("olmoe")
    report = layerlab.verify(model, input_ids=ids, reference=copy.deepcopy(model),
                             only=["forward_parity", "backward_parity"])
    for c in report.checks:
        assert c.status == Status.PASS, (c.name, c.summary)
        assert "ran in float32: this model's `layers.0.mlp.experts`" in c.summary

"""The oracles: a fix that makes the model run is judged on what the fixed copy computes.

For each oracle, a fix that runs and computes the wrong thing must be rejected, and whatever
``layerlab.inspect`` then offers as verified must compute the hand-fixed twin (same weights), or
no fix may be claimed verified at all.
"""

from __future__ import annotations

import pytest
import torch

import layerlab
from layerlab.engine.oracles import judge, model_inputs, runs_backward
from layerlab.probe.context import op_site
from layerlab.probe.fixes import FixedModel, apply_fixes
from layerlab.probe.report import FixStep
from layerlab.probe.verify_fix import copy_model, location, traced_forward
from tests.engine import oracle_models as M


def _judge(model, steps, *args, **kwargs):
    ctx = traced_forward(copy_model(model, None), args, kwargs, 0).ctx
    fixed = apply_fixes(model, steps)
    edited = {s.where if s.kind == "replace-op" else f"{s.where} (" for s in steps}
    from layerlab.engine.fix_search import resized_layers
    from layerlab.engine.oracle_sizes import flattened_inputs, original_free_axes
    from layerlab.engine.oracles import Budget

    free = original_free_axes(model, args, kwargs, 0, ctx, Budget(30))
    return judge(fixed, model, args, kwargs, 0, failed_at=location(ctx), edited=edited, trace=ctx.trace,
                 budget_s=30, resized=resized_layers(model, steps), steps=steps, flattened=flattened_inputs(ctx),
                 free=free)


def _inspect(model, *args):
    torch.manual_seed(0)
    return layerlab.inspect(model, *args, backward=False).failure.diagnosis


def _same(fixed_model, hand, *args):
    hand.load_state_dict(fixed_model.model.state_dict(), strict=True)
    fixed_model.eval()
    hand.eval()
    with torch.no_grad():
        torch.testing.assert_close(fixed_model(*args), hand(*args))


def _set(where, name, value):
    return FixStep("set-arg", where, f"{name}={value}", {"name": name, "value": value})


# -- sizes: the causal TCN whose chomp cut the channels ---------------------------------------------------
def test_tcn_chomp_the_offered_fix_is_the_time_slice():
    torch.manual_seed(0)
    model, x = M.TCN(), torch.randn(3, 8, 20)
    d = _inspect(model, x)
    assert d.verified.status == "runs" and "in_channels" not in d.fix.code
    _same(apply_fixes(model, d.verified.steps), M.TCN(fixed=True), x)
    named = " ".join(d.alternatives)
    assert "in_channels=30" in named, "the other meaning is named"


# -- sizes (the batch): num_features after a squeeze() that ate a batch of 1 -----------------------------
def test_squeeze_that_ate_the_batch_num_features_is_rejected():
    torch.manual_seed(0)
    model, x = M.SqueezeNorm(), torch.randn(1, 4, 20, 3)
    verdict = _judge(model, [_set("bn", "num_features", 20)], x)
    assert not verdict.ok and verdict.failed[0][0] == "sizes"
    assert "batch 2" in verdict.failed[0][1]


def test_squeeze_that_ate_the_batch_offered_fix_computes_the_twin():
    torch.manual_seed(0)
    model, x = M.SqueezeNorm(), torch.randn(1, 4, 20, 3)
    d = _inspect(model, x)
    if d.fix is None or d.verified is None or d.verified.status != "runs":
        assert "num_features=20" not in (d.fix.code if d.fix else "")
        return
    assert "num_features" not in d.fix.code
    _same(apply_fixes(model, d.verified.steps), M.SqueezeNorm(fixed=True), x)


# -- batch independence: batch_first=False to fit a (T, B) key_padding_mask ---------------------------------
def _mask():
    mask = torch.zeros(7, 3, dtype=torch.bool)
    mask[5:, 1] = True
    return mask


def test_batch_first_flip_attends_across_the_batch_and_is_rejected():
    torch.manual_seed(0)
    model, x = M.MaskedAttention(), torch.randn(3, 7, 16)
    verdict = _judge(model, [FixStep("set-attr", "attn", "batch_first=False", {"name": "batch_first", "value": False})],
                     x, _mask())
    assert not verdict.ok and verdict.failed[0][0] == "batch"
    assert "sample 0" in verdict.failed[0][1]


def test_key_padding_mask_offered_fix_computes_the_twin():
    torch.manual_seed(0)
    model, x, mask = M.MaskedAttention(), torch.randn(3, 7, 16), _mask()
    d = _inspect(model, x, mask)
    assert d.fix is None or "batch_first" not in d.fix.code
    if d.verified is not None and d.verified.status == "runs":
        _same(apply_fixes(model, d.verified.steps), M.MaskedAttention(fixed=True), x, mask)
    assert any("batch_first=False" in a and "sample 0" in a for a in d.alternatives) or "batch_first" not in (
        d.hint or "")


def test_the_batch_axis_is_read_from_the_inputs_that_share_it():
    """An LSTM left seq-first for (B, T, C) data: h0 (1, B, H) says the batch is axis 0."""
    x, h0 = torch.randn(3, 9, 5), torch.zeros(1, 3, 7)
    inputs = model_inputs(torch.nn.LSTM(5, 7), (x, h0, h0), {})
    assert inputs.batch == 3 and inputs.axes[0] == 0 and inputs.axes[1] == 1


# -- no parameter tied to a free axis: in_features = T·C ------------------------------------------------------
def test_in_features_tied_to_the_sequence_length_is_rejected():
    torch.manual_seed(0)
    model, x = M.FlattenHead(), torch.randn(3, 9, 6)
    verdict = _judge(model, [_set("fc", "in_features", 144)], x)
    assert not verdict.ok and verdict.failed[0][0] == "sizes" and "9" in verdict.failed[0][1]
    d = _inspect(model, x)
    assert not (d.verified is not None and d.verified.status == "runs" and "in_features=144" in d.fix.code)
    if d.verified is not None and d.verified.status == "runs":
        _same(apply_fixes(model, d.verified.steps), M.FlattenHead(fixed=True), x)


# -- causality where claimed ----------------------------------------------------------------------------------
def test_a_fix_that_reads_the_future_is_rejected_where_the_code_builds_a_causal_mask():
    torch.manual_seed(0)
    model, x = M.CausalAttention(), torch.randn(2, 5, 6)
    ctx = traced_forward(copy_model(model, None), (x,), {}, 0).ctx
    record = ctx.failed_op.record
    step = FixStep("replace-op", record.source, "v.transpose(-2, -1) @ attn", op_site(record, transpose=0))
    assert apply_fixes(model, [step])(x).shape == (2, 5, 6), "the tempting fix runs"
    verdict = _judge(model, [step], x)
    assert not verdict.ok and verdict.failed[0][0] == "causal", verdict


def test_inspect_claims_no_fix_that_reads_the_future():
    torch.manual_seed(0)
    model, x = M.CausalAttention(), torch.randn(2, 5, 6)
    d = _inspect(model, x)
    if d is None or d.verified is None or d.verified.status != "runs":
        return
    fixed = apply_fixes(model, d.verified.steps).eval()
    later = x.clone()
    later[:, 3:] = torch.randn(2, 2, 6)
    with torch.no_grad():
        torch.testing.assert_close(fixed(x)[:, :3], fixed(later)[:, :3])


# -- forward and backward ---------------------------------------------------------------------------------------
def test_a_fix_whose_backward_raises_is_rejected():
    torch.manual_seed(0)
    model, x = M.InPlaceSigmoid(), torch.randn(3, 4)
    fixed = FixedModel(copy_model(model, None), {})
    assert fixed(x).shape == (3, 4), "the forward runs"
    problem = runs_backward(fixed, (x,), {}, 0)
    assert problem and "backward" in problem
    verdict = judge(fixed, model, (x,), {}, 0, failed_at="?", edited=set(), budget_s=30)
    assert not verdict.ok and verdict.failed[0][0] == "backward"


# -- no false alarm ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make, args", [
    (lambda: torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0), (torch.randn(3, 7, 16),)),
    (lambda: torch.nn.LSTM(5, 7, batch_first=True), (torch.randn(3, 9, 5),)),
    (lambda: torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU()),
     (torch.randn(2, 3, 8, 8),)),
    (lambda: torch.nn.GRU(5, 7), (torch.randn(9, 3, 5),)),  # seq-first: the batch is axis 1
    (lambda: torch.nn.Sequential(torch.nn.Embedding(20, 8), torch.nn.Linear(8, 3)), (torch.randint(0, 20, (2, 5)),)),
])
def test_stock_models_pass_every_oracle(make, args):
    """A model that is right (nothing to fix) passes: an oracle that fails here would reject good fixes."""
    torch.manual_seed(0)
    model = make()
    fixed = FixedModel(copy_model(model, None), {})
    verdict = judge(fixed, model, args, {}, 0, failed_at="?", edited={"(root) ("}, budget_s=30)
    assert verdict.ok, verdict.failed
    assert {"backward", "sizes", "batch"} <= set(verdict.passed), verdict


# -- near misses of the sizes and batch oracles ----------------------------------------------------------------
def test_a_head_built_for_a_flattened_length_keeps_its_resize():
    """``fc`` was built for 16·24 (a length by design): ``in_features=16·10`` is the fix, not a tie."""
    torch.manual_seed(0)
    model, ids = M.FlatTextCNN(), torch.randint(0, 30, (3, 12))
    verdict = _judge(model, [_set("fc", "in_features", 160)], ids)
    assert verdict.ok, verdict.failed
    assert any("fixed length by design" in note for note in verdict.skipped)
    _same(apply_fixes(model, [_set("fc", "in_features", 160)]), M.FlatTextCNN(fc_in=160), ids)


def test_integer_inputs_without_the_batch_axis_leave_the_batch_unjudged():
    """An edge list indexes the nodes: the nodes are mixed by design, never 'samples that must stay apart'."""
    torch.manual_seed(0)
    model = M.EdgeSum()
    x, edges = torch.randn(16, 5), torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]])
    fixed = FixedModel(copy_model(model, None), {})
    verdict = judge(fixed, model, (x, edges), {}, 0, failed_at="?", edited=set(), budget_s=30)
    assert verdict.ok and "batch" not in verdict.passed
    assert any("without the batch axis" in note for note in verdict.skipped)

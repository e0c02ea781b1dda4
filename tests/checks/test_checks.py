"""Each check on correct torch.nn layers (they pass), on small broken ones, and its skip reasons."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from layerlab.checks.case import Arg, Case
from layerlab.checks.report import Status
from layerlab.checks.run import VerifyOptions, verify


def one(name, module, *inputs, **kwargs):
    report = verify(module, *inputs, only=[name], **kwargs)
    assert [c.name for c in report.checks] == [name]
    return report.checks[0]


def seeded(fn):
    torch.manual_seed(0)
    return fn()


# -- runs ---------------------------------------------------------------------------------------------

def test_runs_checks_conv_against_explain_shapes_formula():
    c = one("runs", nn.Conv2d(3, 4, 3, stride=2, padding=1), torch.randn(2, 3, 9, 9))
    assert c.status == Status.PASS, c.summary
    assert c.details["formula"]["predicted"] == [2, 4, 5, 5] == c.details["formula"]["actual"]


def test_runs_names_the_failing_submodule_and_what_ran_before():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(5, 3))
    c = one("runs", model, torch.randn(2, 4))
    assert c.status == Status.FAIL
    assert c.where == "2"
    assert c.details["failing_inputs"] == [[2, 8]]
    assert [s["module"] for s in c.details["ran_before"]] == ["0", "1"]
    assert c.details["exception"] == "RuntimeError"


def test_layer_that_does_not_run_skips_everything_else():
    report = verify(nn.Linear(5, 3), torch.randn(2, 4))
    assert report.check("runs").status == Status.FAIL
    assert all(c.status == Status.SKIP for c in report.checks[1:])
    assert not report.ok


class _Upcast(nn.Module):
    def forward(self, x):
        return x.double() * 2


def test_runs_dtype_contract():
    c = one("runs", _Upcast(), torch.randn(2, 3))
    assert c.status == Status.FAIL and c.where == "output"
    assert "float64 for float32 input" in c.summary


# -- parity -------------------------------------------------------------------------------------------

def test_parity_passes_for_identical_layers_in_float64_and_float32():
    report = seeded(lambda: verify(nn.GRU(4, 5, batch_first=True), torch.randn(2, 3, 4),
                                   reference=nn.GRU(4, 5, batch_first=True),
                                   only=["forward_parity", "backward_parity"]))
    fwd, bwd = report.checks
    assert fwd.status == Status.PASS and [r["dtype"] for r in fwd.details["runs"]] == ["float64", "float32"]
    assert bwd.status == Status.PASS
    names = [c["what"] for c in bwd.details["comparisons"]]
    assert names[0] == "grad input" and "grad weight_hh_l0" in names
    assert all(c["rtol"] == 1e-7 and c["atol"] == 1e-7 for c in bwd.details["comparisons"])


class _InOutLinear(nn.Module):
    """Stores W as (in, out) under another name: needs weight_map with a transpose."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n_in, n_out))
        self.b = nn.Parameter(torch.randn(n_out))

    def forward(self, x):
        return x @ self.w + self.b


def test_weight_map_with_transpose():
    report = verify(_InOutLinear(4, 3), torch.randn(2, 4), reference=nn.Linear(4, 3),
                    weight_map={"w": "weight.T", "b": "bias"}, only=["forward_parity", "backward_parity"])
    assert report.ok, [c.summary for c in report.checks]
    assert "weight_map" in report.settings["reference_weights"]


def test_unmappable_weights_fail_with_the_missing_names():
    c = one("forward_parity", _InOutLinear(4, 3), torch.randn(2, 4), reference=nn.Linear(4, 3))
    assert c.status == Status.FAIL and c.where == "reference"
    assert "['weight', 'bias']" in c.summary and "weight_map" in c.hint


def test_function_reference():
    c = one("forward_parity", nn.GELU(approximate="tanh"), torch.randn(3, 4), reference=F.gelu)
    assert c.status == Status.FAIL  # tanh approximation ≠ exact erf GELU in float64
    assert one("backward_parity", nn.GELU(), torch.randn(3, 4), reference=F.gelu).status == Status.PASS


def test_forward_divergence_is_located_in_the_submodule():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    ours = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid(), nn.Linear(4, 2))
    c = one("forward_parity", ours, torch.randn(3, 4), reference=ref)
    assert c.status == Status.FAIL and c.where == "1"


# -- gradcheck ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("make, shape", [
    (lambda: nn.LSTM(3, 4, num_layers=2, bidirectional=True), (5, 2, 3)),
    (lambda: nn.Conv1d(2, 3, 3, padding=1), (2, 2, 6)),
    (lambda: nn.LayerNorm(5), (3, 5)),
    (lambda: nn.MultiheadAttention(4, 2), None),
])
def test_gradcheck_passes_on_torch_layers(make, shape):
    torch.manual_seed(0)
    m = make()
    inputs = (torch.randn(shape),) if shape else (torch.randn(3, 2, 4),) * 3
    c = one("gradcheck", m, *inputs)
    assert c.status == Status.PASS, c.summary
    names = [t["name"] for t in c.details["checked"]]
    assert set(n for n, p in m.named_parameters()) <= set(names)


class _SquareFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x  # drops the factor 2


class _Square(nn.Module):
    def forward(self, x):
        return _SquareFn.apply(x)


def test_gradcheck_names_the_input_and_the_ratio():
    c = one("gradcheck", _Square(), torch.randn(3, 4))
    assert c.status == Status.FAIL and c.where == "x"
    row = next(r for r in c.details["directional"] if not r["ok"])
    assert row["ratio"] == pytest.approx(0.5, rel=1e-4)
    assert c.details["slow"][0]["ran"] and "Jacobian mismatch" in c.details["slow"][0]["message"]


# -- param_grads --------------------------------------------------------------------------------------

class _Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(3, 3)
        self.spare = nn.Linear(3, 3)

    def forward(self, x):
        return self.used(x)


def test_param_grads_names_unused_parameters():
    c = one("param_grads", _Unused(), torch.randn(2, 3))
    assert c.status == Status.FAIL and c.where == "spare.weight, spare.bias"


def test_param_grads_excused_when_the_reference_has_none_either():
    c = one("param_grads", _Unused(), torch.randn(2, 3), reference=_Unused())
    assert c.status == Status.PASS and c.details["same_in_reference"] == ["spare.weight", "spare.bias"]


def test_param_grads_reports_nonfinite():
    class _Log(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.zeros(3))

        def forward(self, x):
            return x * torch.log(self.scale)

    c = one("param_grads", _Log(), torch.randn(2, 3))
    assert c.status == Status.FAIL and c.where == "scale" and "non-finite" in c.summary


# -- batch --------------------------------------------------------------------------------------------

def test_batchnorm_in_train_mode_is_checked_in_eval_mode():
    bn = nn.BatchNorm1d(4).train()
    report = verify(bn, torch.randn(3, 4), only=["batch_independence", "batch_consistency"])
    assert report.ok and all(c.status == Status.PASS for c in report.checks)
    assert "eval mode" in report.checks[0].details["notes"][0]
    assert bn.training  # the user's module is left as it was


def test_batch_mixing_by_design_is_skipped_with_the_reason():
    c = one("batch_independence", nn.BatchNorm1d(4, track_running_stats=False), torch.randn(3, 4))
    assert c.status == Status.SKIP and "running statistics" in c.summary
    c = one("batch_consistency", nn.Linear(3, 3), torch.randn(2, 3), tags=["mixes_batch"])
    assert c.status == Status.SKIP and "by design" in c.summary


def test_seq_first_layers_use_batch_dim_1():
    c = one("batch_independence", nn.GRU(3, 4), torch.randn(5, 2, 3))
    assert c.status == Status.PASS, c.summary
    assert c.details["output_batch_dims"] == {"output[0]": 1, "output[1]": 1}


@pytest.mark.parametrize("module, x", [
    (nn.RNN(3, 4), torch.randn(5, 3)),  # an unbatched (T, I) sequence
    (nn.Linear(3, 2), torch.randn(3)),  # a feature vector
    (nn.Conv2d(3, 2, 3), torch.randn(3, 6, 6)),  # an unbatched image: one "sample" is one channel
])
def test_unbatched_inputs_are_not_read_as_batches(module, x):
    for name in ("batch_independence", "batch_consistency"):
        c = one(name, module, x)
        assert c.status == Status.SKIP, c.summary


def test_batch_dims_override():
    c = one("batch_independence", nn.Conv2d(3, 2, 3), torch.randn(3, 6, 6), batch_dims={"input": None})
    assert c.status == Status.SKIP and "need at least 2" in c.summary


def test_batch_size_one_skips():
    assert one("batch_consistency", nn.Linear(3, 2), torch.randn(1, 3)).status == Status.SKIP


# -- causality ----------------------------------------------------------------------------------------

def test_causality_skips_layers_that_do_not_claim_it():
    c = one("causality", nn.Linear(3, 3), torch.randn(2, 3))
    assert c.status == Status.SKIP and "does not claim" in c.summary


def test_causality_passes_for_a_causally_masked_encoder_layer():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    mask = nn.Transformer.generate_square_subsequent_mask(6)
    c = one("causality", layer, torch.randn(2, 6, 8), src_mask=mask)
    assert c.status == Status.PASS, c.summary
    assert c.details["claim"] == "a causal mask is passed as 'src_mask'"


class _LeftPadConv(nn.Module):
    def __init__(self, pad_left):
        super().__init__()
        self.pad_left = pad_left
        self.conv = nn.Conv1d(2, 2, 3)

    def forward(self, x):
        return self.conv(F.pad(x, (self.pad_left, 2 - self.pad_left)))


def test_causal_conv_and_a_centred_one_that_claims_causality():
    torch.manual_seed(0)
    assert one("causality", _LeftPadConv(2), torch.randn(2, 2, 7), tags=["causal"]).status == Status.PASS
    c = one("causality", _LeftPadConv(1), torch.randn(2, 2, 7), tags=["causal"])
    assert c.status == Status.FAIL
    assert (c.details["first_leaking_position"], c.details["leaks_from"]) == (0, 1)


# -- recurrent ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("make, shape", [
    (lambda: nn.GRU(3, 4, num_layers=2), (5, 2, 3)),
    (lambda: nn.LSTM(3, 4, bidirectional=True, batch_first=True), (2, 5, 3)),
    (lambda: nn.LSTM(3, 4, proj_size=2, batch_first=True), (2, 5, 3)),
    (lambda: nn.RNN(3, 4), (5, 3)),  # unbatched
    (lambda: nn.LSTMCell(3, 4), (2, 3)),
    (lambda: nn.GRUCell(3, 4), (2, 3)),
])
def test_recurrent_state_contract_on_torch_layers(make, shape):
    torch.manual_seed(0)
    c = one("recurrent_state", make(), torch.randn(shape))
    assert c.status == Status.PASS, c.summary


def test_recurrent_skips_other_layers():
    assert one("recurrent_state", nn.Linear(2, 2), torch.randn(2, 2)).status == Status.SKIP


class _Float32State(nn.Module):
    """Builds its default h0 without dtype=: breaks in float64."""

    def __init__(self):
        super().__init__()
        self.hidden_size, self.num_layers = 4, 1
        self.cell = nn.RNNCell(3, 4)

    def forward(self, input, hx=None):
        h = torch.zeros(input.shape[1], 4) if hx is None else hx[0]
        outs = []
        for x in input:
            h = self.cell(x, h)
            outs.append(h)
        return torch.stack(outs), h.unsqueeze(0)


def test_recurrent_default_state_must_follow_the_input_dtype():
    c = one("recurrent_state", _Float32State(), torch.randn(5, 2, 3))
    assert c.status == Status.FAIL and c.where == "h0" and "dtype=x.dtype" in c.hint


# -- masks --------------------------------------------------------------------------------------------

def _mha():
    torch.manual_seed(0)
    return nn.MultiheadAttention(8, 2, batch_first=True), torch.randn(2, 5, 8)


def test_masks_probe_torch_conventions():
    mha, x = _mha()
    c = one("masks", mha, x, x, x)
    assert c.status == Status.PASS, c.summary
    assert c.details["probe"]["float_minus_inf_blocks"] is True
    assert c.details["probe"]["bool_semantics"].startswith("True = blocked")


def test_float_01_causal_mask_fails():
    mha, x = _mha()
    keep = torch.ones(5, 5).tril()  # 1 = attend, as a float: added to the scores, blocks nothing
    c = one("masks", mha, x, x, x, attn_mask=keep)
    assert c.status == Status.FAIL and c.where == "attn_mask"
    assert "blocks nothing" in c.summary and "masked_fill" in c.hint


def test_inverted_bool_causal_mask_warns():
    mha, x = _mha()
    sdpa_style = torch.ones(5, 5, dtype=torch.bool).tril()  # SDPA: True = attend
    c = one("masks", mha, x, x, x, attn_mask=sdpa_style)
    assert "inverted" in c.summary and "~mask" in c.hint
    assert c.status == Status.FAIL and "NaN" in c.summary  # its last row blocks every key


def test_key_padding_mask_shape():
    mha, x = _mha()
    kpm = torch.zeros(5, 2, dtype=torch.bool)  # (S, B) instead of (B, S)
    c = one("masks", mha, x, x, x, key_padding_mask=kpm)
    assert c.status == Status.FAIL and c.where == "key_padding_mask" and "transposed" in c.summary


def test_fully_masked_rows_give_nan():
    mha, x = _mha()
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[0] = True  # every key of sample 0 padded
    c = one("masks", mha, x, x, x, key_padding_mask=kpm)
    assert c.status == Status.FAIL and "NaN" in c.summary and "at least one key" in c.hint


class _IgnoresMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, query, key, value, attn_mask=None):
        return self.inner(query, key, value)[0]


def test_a_mask_argument_that_does_nothing_fails():
    _, x = _mha()
    c = one("masks", _IgnoresMask(), x, x, x)
    assert c.status == Status.FAIL and "no effect" in c.summary


# -- deep ---------------------------------------------------------------------------------------------

class _RawMemory(nn.Module):
    """Reads the input's storage as if it were contiguous (wrong for strided inputs)."""

    def forward(self, x):
        return torch.as_strided(x, x.shape, [x.shape[1], 1], x.storage_offset()) * 2


def test_deep_checks_on_a_torch_layer():
    torch.manual_seed(0)
    report = verify(nn.Linear(4, 3), torch.randn(2, 4), only=["gradgradcheck", "noncontiguous", "determinism"])
    assert report.ok and all(c.status == Status.PASS for c in report.checks), [c.summary for c in report.checks]


def test_noncontiguous_poisoned_gaps_catch_raw_memory_reads():
    c = one("noncontiguous", _RawMemory(), torch.randn(3, 4))
    assert c.status == Status.FAIL and c.where == "output" and "NaN" in (c.details["comparisons"][0]["note"] or "")


def test_compile_parity_with_a_fast_backend():
    from layerlab.checks.deep import compile_parity

    torch.manual_seed(0)
    case = Case(nn.Linear(4, 3), [Arg("input", torch.randn(2, 4))], "linear")
    c = compile_parity(case, VerifyOptions(compile_backend="aot_eager"))
    assert c.status == Status.PASS, c.summary


# -- the report -----------------------------------------------------------------------------------------

def test_report_json_and_module_untouched():
    torch.manual_seed(0)
    m = nn.LSTM(3, 4)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    report = verify(m, torch.randn(5, 2, 3), reference=nn.LSTM(3, 4))
    assert report.ok
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    d = report.to_dict()
    assert d["kind"] == "gradcheck-report" and d["ok"] is True
    assert [c["name"] for c in d["checks"]][:4] == ["runs", "forward_parity", "backward_parity", "gradcheck"]
    assert torch.get_num_threads() >= 1


def test_unknown_check_name_is_a_usage_error():
    from layerlab.errors import UsageError

    with pytest.raises(UsageError, match="no check called 'gradchek'"):
        verify(nn.Linear(2, 2), torch.randn(2, 2), only=["gradchek"])

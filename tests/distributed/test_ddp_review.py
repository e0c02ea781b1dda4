"""ddp_check on models nobody here wrote (no false alarm), on DDP pitfalls found in review (each
named with its cause), on bad input (a clear error, before any rank starts), and on the way out
(no rank process left behind, ``print(report)``).

Expected gradients come from plain torch in the test (the whole batch, or one shard), never from
layerlab's own single-process side.
"""

from __future__ import annotations

import os

import pytest
import torch

import layerlab
from layerlab.errors import CheckFailed, UsageError
from tests.distributed import planted as P


def torch_grad_norms(model, args, loss):
    model.zero_grad()
    loss(model(*args)).backward()
    return {n: float(p.grad.double().norm()) for n, p in model.named_parameters()}


def weighted(out):
    """A per-sample mean with fixed weights over the feature dim (never over the batch dim, whose size
    differs per rank: DDP must reproduce it exactly)."""
    outs = out if isinstance(out, tuple) else (out,)
    return sum((o * torch.linspace(-1, 1, o.shape[-1])).mean() if o.dim() > 1 else o.mean() for o in outs)


def loss_fn(output, inputs):
    return weighted(output)


def assert_clean_and_equal_to_torch(r, model, args):
    assert r.ok and r.findings == [], [(f.title, f.message) for f in r.findings]
    want = torch_grad_norms(model, args, weighted)
    for rank in r.raw:
        for name, norm in rank["ddp"]["grad_norms"].items():
            assert norm == pytest.approx(want[name], rel=1e-4, abs=1e-7), name


def test_seq_first_lstm_splits_dim_1_and_raises_no_false_alarm():
    x = torch.randn(5, 4, 8, generator=torch.Generator().manual_seed(4))  # (T, B, C), T ≠ B
    r = layerlab.ddp_check(P.SeqHead(), x, nproc=2, timeout=20, loss=loss_fn)
    assert r.batch_dims == {"x": 1} and [row.inputs[0].shape for row in r.ranks] == [[5, 4, 8], [5, 2, 8], [5, 2, 8]]
    assert_clean_and_equal_to_torch(r, P.SeqHead(), (x,))


def test_embedding_on_integer_ids_and_dict_in_tuple_out_raise_no_false_alarm():
    ids = torch.randint(0, 50, (4, 7), generator=torch.Generator().manual_seed(5))
    r = layerlab.ddp_check(P.BagOfEmbeddings(), ids, nproc=2, timeout=20, loss=loss_fn)
    assert_clean_and_equal_to_torch(r, P.BagOfEmbeddings(), (ids,))
    g = torch.Generator().manual_seed(6)
    batch = {"x": torch.randn(4, 6, generator=g), "y": torch.randn(4, 4, generator=g)}
    r = layerlab.ddp_check(P.DictToTuple(), batch, nproc=2, timeout=20, loss=loss_fn)
    assert r.batch_dims == {"batch['x']": 0, "batch['y']": 0}
    assert_clean_and_equal_to_torch(r, P.DictToTuple(), (batch,))


def test_encoder_layer_without_dropout_and_default_loss_raises_no_false_alarm():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0)  # batch_first=False: (T, B, E)
    r = layerlab.ddp_check(layer, torch.randn(5, 4, 16, generator=torch.Generator().manual_seed(7)), nproc=2,
                           timeout=20)
    assert r.ok and r.findings == [] and r.batch_dims == {"src": 1}, r.findings


def test_tiny_gpt2_without_dropout_has_no_finding_at_all():
    transformers = pytest.importorskip("transformers", reason="the Hugging Face check needs transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=16, vocab_size=64, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(3))
    r = layerlab.ddp_check(transformers.GPT2LMHeadModel(cfg), ids, nproc=2, timeout=30)
    assert r.ok and r.findings == [], [(f.title, f.message) for f in r.findings]


def test_per_rank_mean_over_unequal_counts_is_named_with_each_ranks_share():
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(8))
    x[:, 0] = torch.tensor([1., 1., 1., -1., 1., -1., -1., -1.])  # rank 0 keeps 3 rows, rank 1 keeps 1
    r = layerlab.ddp_check(P.mlp(), x, nproc=2, timeout=20, loss=P.masked_mean_loss)
    f = r.finding("loss averaged per rank over unequal counts")
    assert f.severity == "error" and "c = (0.75, 0.25)" in f.message and "all_reduce" in f.fix
    # what DDP really computed: the plain average of each shard's own masked mean, by plain torch
    shards = [torch_grad_norms(P.mlp(), (x[i:i + 4],), lambda o, i=i: P.masked_mean_loss(o, {"x": x[i:i + 4]}))
              for i in (0, 4)]
    model = P.mlp()
    for i in (0, 4):
        (P.masked_mean_loss(model(x[i:i + 4]), {"x": x[i:i + 4]}) / 2).backward()
    assert r.raw[0]["ddp"]["grad_norms"]["0.weight"] == pytest.approx(float(model[0].weight.grad.norm()), rel=1e-5)
    assert shards[0]["0.weight"] > 0 and shards[1]["0.weight"] > 0
    # equal counts per rank: the same loss is a global mean, and nothing is said
    x[:, 0] = torch.tensor([1., 1., -1., -1., 1., -1., 1., -1.])
    assert layerlab.ddp_check(P.mlp(), x, nproc=2, timeout=20, loss=P.masked_mean_loss).findings == []


def test_parameter_used_only_on_some_inputs_is_data_dependent_not_rank_dependent():
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(9))
    x[:4, 0], x[4:, 0] = 1.0, -1.0  # rank 0's samples take the route, rank 1's do not
    r = layerlab.ddp_check(P.Router(), x, nproc=2, timeout=20)
    f = r.finding("data-dependent control flow")
    assert f.severity == "error" and f.where[0] == "extra" and "find_unused_parameters=True" in f.fix
    assert "rank-dependent control flow" not in r.titles()
    assert [t for t in r.titles() if t != "data-dependent control flow"] == []  # per-sample: DDP's grad is right
    r = layerlab.ddp_check(P.Router(), x, nproc=2, timeout=20, find_unused_parameters=True)
    assert r.ok and r.finding("data-dependent control flow").severity == "info"


def test_branch_on_a_batch_level_value_is_named():
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(9))
    x[:4, 0], x[4:, 0] = 2.0, -1.0  # the whole batch's mean is positive, rank 1's is not
    r = layerlab.ddp_check(P.DecidedOnTheBatch(), x, nproc=2, timeout=20)
    assert r.finding("data-dependent control flow").where[0] == "extra"
    assert r.finding("control flow decided by the whole batch").where == ["extra"]


def test_get_rank_in_forward_without_a_group_is_said_as_such():
    with pytest.raises(CheckFailed, match="calls torch.distributed in its forward") as info:
        layerlab.ddp_check(P.RankInForward(), torch.randn(8, 16), nproc=2, timeout=20)
    assert "planted.py" in info.value.where and "is_initialized" in info.value.hint


def test_bad_input_says_what_and_where():
    with pytest.raises(UsageError, match=r"a batch of 2 \(dim 0 of input\) cannot feed 4 ranks"):
        layerlab.ddp_check(P.mlp(), torch.randn(2, 16), nproc=4)
    with pytest.raises(UsageError, match=r"a batch of 1 \(dim 1 of x\) cannot feed 2 ranks"):
        layerlab.ddp_check(P.SeqHead(), torch.randn(5, 1, 8), nproc=2)
    model = P.mlp()
    model.scale = lambda t: t * 2  # a lambda on the module: the ranks cannot unpickle it
    with pytest.raises(UsageError, match="cannot receive the model .*lambda"):
        layerlab.ddp_check(model, torch.randn(8, 16), nproc=2)


def test_no_rank_process_outlives_a_hung_check():
    r = layerlab.ddp_check(P.HangsOnRankOne(), torch.randn(8, 16), nproc=2, timeout=3)
    pids = [rank["pid"] for rank in r.raw]
    assert r.ranks[2].status == "hung" and all(pids)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_print_and_render_show_the_report():
    r = layerlab.ddp_check(P.batchnorm_mlp(), torch.randn(8, 16, generator=torch.Generator().manual_seed(1)),
                           nproc=2, timeout=20)
    text = layerlab.render(r, width=120)
    assert str(r) == layerlab.render(r) and "BatchNorm without SyncBatchNorm" in text and "rank 1" in text
    assert repr(r).startswith("<DdpReport") and "ok" in repr(r)


def test_an_unguarded_script_is_told_to_add_the_main_guard(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text("import torch, layerlab\nfrom torch import nn\n\n\nclass M(nn.Module):\n"
                      "    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(16, 4)\n\n"
                      "    def forward(self, x):\n        return self.fc(x)\n\n\n"
                      "r = layerlab.ddp_check(M(), torch.randn(8, 16), nproc=2, timeout=10)\n"
                      "print(r.titles(), r.findings[0].message)\n")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "['rank 0 killed', 'rank 1 killed']" in done.stdout and "if __name__ == '__main__'" in done.stdout
    assert "Traceback" not in done.stderr  # one report, not multiprocessing's page per rank

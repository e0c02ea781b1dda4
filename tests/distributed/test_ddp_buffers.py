"""ddp-check's buffers table: a buffer is listed when some rank changes it or the ranks disagree.

A rotary ``inv_freq`` is registered with ``persistent=False``, so it is not in the state dict the
ranks used to compare against: every rank looked as if it had changed it ("changed on 0, 1 … Δ 0")
on Llama, Phi3, Falcon, Gemma2, Mixtral. Each rank now compares every buffer with its own start.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import layerlab


class CountsSteps(nn.Module):
    """A non-persistent buffer every rank changes the same way (a step counter): it is listed, agreeing."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(16, 4)
        self.register_buffer("steps", torch.zeros(()), persistent=False)
        self.register_buffer("table", torch.arange(4.0), persistent=False)  # never changes: not listed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        return self.fc(x) + self.table


def phi3():
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(0)
    return Phi3ForCausalLM(Phi3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)).eval()


@pytest.mark.slow
def test_rotary_inv_freq_that_no_step_changes_is_not_listed():
    model = phi3()
    ids = torch.randint(3, 64, (4, 8), generator=torch.Generator().manual_seed(1))
    rotary = {n: b.clone() for n, b in model.named_buffers() if "rotary" in n}
    assert rotary and not any(n in model.state_dict() for n in rotary)  # non-persistent, as in every HF rotary
    twin = copy.deepcopy(model)  # plain torch: a training step leaves them as they were
    twin(input_ids=ids).logits.mean().backward()
    assert all(torch.equal(b, rotary[n]) for n, b in twin.named_buffers() if n in rotary)
    r = layerlab.ddp_check(model, input_ids=ids, nproc=2, timeout=60)
    assert r.ok and r.findings == [], r.findings
    assert [b.name for b in r.buffers] == []  # before: inv_freq, original_inv_freq "changed on 0, 1"
    assert "buffers" not in layerlab.render(r, width=150)


def test_a_non_persistent_buffer_every_rank_changes_alike_is_listed_as_agreeing():
    r = layerlab.ddp_check(CountsSteps(), torch.randn(8, 16, generator=torch.Generator().manual_seed(1)), nproc=2,
                           timeout=30)
    assert r.ok and r.findings == [], r.findings
    assert [(b.name, b.changed_on, b.ranks_diff, b.status) for b in r.buffers] == [("steps", [0, 1], 0.0, "ok")]

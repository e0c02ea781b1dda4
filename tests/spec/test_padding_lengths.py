"""A padding mask whose lengths cannot fit the token ids it pads is a spec error at its line, not a
failure deep inside the model (found by a new-user review: lengths [9, 5] for ids [3, 8])."""

from __future__ import annotations

import pytest
import torch

from layerlab.errors import SpecError
from layerlab.spec import build, load_spec

HEAD = "layer: ./seq2seq.py:Seq2Seq\ninputs:\n"

MODEL = """
import torch
from torch import nn

class Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 4)

    def forward(self, input_ids, attention_mask=None, decoder_input_ids=None, decoder_attention_mask=None):
        return self.embed(input_ids) * attention_mask[..., None]
"""


def parse_spec_text(text, filename="spec.yaml", tmp=None):
    tmp.joinpath("seq2seq.py").write_text(MODEL)
    path = tmp / filename
    path.write_text(text)
    return load_spec(str(path), allow_import=True)


def test_too_few_lengths_or_a_length_beyond_the_sequence_is_refused_at_the_mask(tmp_path):
    text = HEAD + ("  input_ids: {shape: [3, 8], low: 0, high: 100}\n"
                   "  attention_mask: {padding_mask: {lengths: [9, 5], convention: keep}}\n")
    with pytest.raises(SpecError) as err:
        parse_spec_text(text, filename="bad.yaml", tmp=tmp_path)
    assert "(2, 9)" in err.value.message and "[3, 8]" in err.value.message
    assert ":4:" in err.value.where and "bad.yaml" in err.value.where


def test_a_mask_that_fits_builds_as_torch_would_read_it(tmp_path):
    text = HEAD + ("  input_ids: {shape: [2, 8], low: 0, high: 100}\n"
                   "  attention_mask: {padding_mask: {lengths: [8, 5], convention: keep}}\n")
    built = build(parse_spec_text(text, tmp=tmp_path))
    mask = dict(built.inputs)["attention_mask"] if isinstance(built.inputs, list) else built.inputs["attention_mask"]
    assert torch.equal(mask, (torch.arange(8)[None, :] < torch.tensor([8, 5])[:, None]).long())


def test_a_decoder_mask_is_measured_against_the_decoder_ids(tmp_path):
    text = HEAD + ("  input_ids: {shape: [2, 8], low: 0, high: 100}\n"
                   "  decoder_input_ids: {shape: [2, 5], low: 0, high: 100}\n"
                   "  decoder_attention_mask: {padding_mask: {lengths: [5, 3], convention: keep}}\n")
    parse_spec_text(text, tmp=tmp_path)  # (2, 5) pads decoder_input_ids [2, 5]: fine
    with pytest.raises(SpecError, match="decoder_input_ids"):
        parse_spec_text(text.replace("lengths: [5, 3]", "lengths: [8, 3]"), tmp=tmp_path)

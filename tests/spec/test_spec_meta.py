"""``build(spec, meta=True)`` / ``Overrides(meta=True)``: constructors run under ``torch.device("meta")``.

A model bigger than the machine is built with shapes only; memory is measured in a fresh
subprocess (its peak RSS, ``VmHWM``), so earlier tests cannot inflate it.
"""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn

from layerlab.spec import Overrides, build, parse_spec_text

SMALL = """
block:
  - layer: TransformerEncoderLayer
    args: {d_model: 16, nhead: 2, dim_feedforward: 32, batch_first: true}
    repeat: 2
inputs: {input: [2, 5, 16]}
"""


def test_meta_build_matches_a_real_build_in_shapes_and_inputs():
    spec = parse_spec_text(SMALL)
    real, meta = build(spec), build(spec, meta=True)
    real_shapes = {n: (tuple(p.shape), p.dtype) for n, p in real.module.named_parameters()}
    meta_shapes = {n: (tuple(p.shape), p.dtype) for n, p in meta.module.named_parameters()}
    assert meta_shapes == real_shapes and len(real_shapes) > 10
    assert all(p.is_meta for p in meta.module.parameters()) and not any(p.is_meta for p in real.module.parameters())
    # the inputs stay real CPU tensors, the same values a real build draws (inspect's meta path converts them)
    assert meta.inputs["input"].device.type == "cpu" and torch.equal(meta.inputs["input"], real.inputs["input"])
    via_overrides = build(parse_spec_text(SMALL, overrides=Overrides(meta=True)))
    assert all(p.is_meta for p in via_overrides.module.parameters())


def test_meta_build_casts_only_when_asked():
    spec = parse_spec_text(SMALL.replace("inputs:", "dtype: float64\ninputs:"))
    meta = build(spec, meta=True)
    assert {p.dtype for p in meta.module.parameters()} == {torch.float64}


def _rss_run(code: str) -> dict:
    # peak RSS of this process's own address space (VmHWM); ru_maxrss would carry over the parent's
    # (Linux keeps it across fork + exec), so a big pytest process would be measured instead
    script = textwrap.dedent(code) + textwrap.dedent("""
        import json, resource
        try:
            hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
        except OSError:
            hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({"numel": sum(p.numel() for p in b.module.parameters()),
                          "meta": all(p.is_meta for p in b.module.parameters()), "rss_mb": hwm / 1024}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_32_layer_d4096_torch_stack_builds_on_meta_in_little_memory():
    result = _rss_run("""
        from layerlab.spec import build, parse_spec_text
        b = build(parse_spec_text('''
        block:
          - layer: TransformerEncoderLayer
            args: {d_model: 4096, nhead: 32, dim_feedforward: 11008, batch_first: true}
            repeat: 32
        inputs: {input: [1, 16, 4096]}
        '''), meta=True)
    """)
    with torch.device("meta"):
        one = nn.TransformerEncoderLayer(4096, 32, 11008, batch_first=True)
    assert result["numel"] == 32 * sum(p.numel() for p in one.parameters())  # 5.0e9: 20 GB in float32
    assert result["meta"] and result["rss_mb"] < 500, result


def test_llama_7b_config_builds_on_meta_in_little_memory():
    pytest.importorskip("transformers", reason="Hugging Face models need the [hf] extra")
    result = _rss_run("""
        from layerlab.spec import Overrides, build, parse_spec_text
        b = build(parse_spec_text('''
        layer: transformers:LlamaModel
        args:
          config: {class: transformers:LlamaConfig, args: {hidden_size: 4096, intermediate_size: 11008,
                   num_hidden_layers: 32, num_attention_heads: 32, num_key_value_heads: 32, vocab_size: 32000}}
        inputs: {input_ids: {shape: [1, 16], low: 0, high: 32000}}
        ''', allow_import=True, overrides=Overrides(meta=True)))
    """)
    # Llama-2-7B has 6,738,415,616 parameters; LlamaModel is that without the lm_head (32000 × 4096)
    assert result["numel"] == 6_738_415_616 - 32000 * 4096
    assert result["meta"] and result["rss_mb"] < 500, result

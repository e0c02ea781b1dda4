"""A torch.jit.trace of a registry layer made at one size equals eager at other sizes.

For every registry layer where tracing is claimed (all but :data:`FIXED_SIZE_TRACE`), the layer
is traced at its registry inputs and then run at other sizes — batch + 1, and each other dim − 1
where eager still runs (a channel or feature dim the weights fix makes eager raise, so it is left
out) — and compared with eager. The trace must record no TracerWarning. The layers in
:data:`FIXED_SIZE_TRACE` are traced too, and the test asserts that they really do not
generalise, so the list cannot silently go stale when one is fixed.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from layerlab import registry
from tests.registry_inputs import build

#: registry layers whose trace holds for the traced size only, and why (the README says the same)
FIXED_SIZE_TRACE = {
    "rnn": "the time loop is Python: the trace unrolls it for the traced length",
    "lstm": "the time loop is Python: the trace unrolls it for the traced length",
    "gru": "the time loop is Python: the trace unrolls it for the traced length",
    "adaptive_avg_pool1d": "the bins are Python ranges computed from the traced length",
    "adaptive_avg_pool2d": "the bins are Python ranges computed from the traced size",
    "adaptive_max_pool1d": "the bins are Python ranges computed from the traced length",
    "adaptive_max_pool2d": "the bins are Python ranges computed from the traced size",
    "soft_adaptive_pool2d": "the bins are Python ranges computed from the traced size",
}
CLAIMED = [n for n in registry.names() if n not in FIXED_SIZE_TRACE]


class _Positional(nn.Module):
    """The layer with its keyword inputs given by position, as torch.jit.trace needs (masks stay inputs)."""

    def __init__(self, module: nn.Module, n_args: int, names) -> None:
        super().__init__()
        self.module, self.n_args, self.names = module, n_args, list(names)

    def forward(self, *tensors):
        args, rest = tensors[:self.n_args], tensors[self.n_args:]
        return self.module(*args, **dict(zip(self.names, rest)))


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _other_sizes(name: str):
    """``{input: shape}`` overrides: batch + 1, then each later dim − 1."""
    entry = registry.get(name)
    for key, spec in entry.inputs.items():
        if "shape" not in spec:
            continue
        shape = spec["shape"]
        for dim in range(len(shape)):
            new = list(shape)
            new[dim] += 1 if dim == 0 else -1
            yield f"{key} {tuple(shape)} → {tuple(new)}", {key: new}


def _trace(name: str):
    module, args, kwargs = build(name)
    wrapped = _Positional(module, len(args), kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = torch.jit.trace(wrapped, (*args, *kwargs.values()), check_trace=False)
    tracer = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    return wrapped, traced, tracer


def _mismatches(name: str, wrapped, traced):
    """Descriptions of the other sizes where eager runs and the trace raises or differs; and how many were tried."""
    bad, tried = [], 0
    for description, shapes in _other_sizes(name):
        _, args, kwargs = build(name, shapes, seed=1)
        inputs = (*args, *kwargs.values())
        with torch.no_grad():
            try:
                expected = _first(wrapped(*inputs))
            except Exception:
                continue  # a size the weights rule out (channels, features): eager raises too
            tried += 1
            try:
                got = _first(traced(*inputs))
            except Exception as exc:
                bad.append(f"{description}: the trace raises {type(exc).__name__}")
                continue
        if got.shape != expected.shape or not torch.allclose(got, expected, rtol=1e-4, atol=1e-5):
            bad.append(f"{description}: the trace differs from eager")
    return bad, tried


@pytest.mark.parametrize("name", CLAIMED)
def test_a_trace_at_one_size_equals_eager_at_others(name):
    wrapped, traced, tracer_warnings = _trace(name)
    assert tracer_warnings == []
    bad, tried = _mismatches(name, wrapped, traced)
    assert tried >= 1  # at least the batch + 1
    assert bad == []


@pytest.mark.parametrize("name", sorted(FIXED_SIZE_TRACE))
def test_the_layers_said_to_trace_for_one_size_only_really_do(name):
    wrapped, traced, _ = _trace(name)
    bad, _ = _mismatches(name, wrapped, traced)
    assert bad, f"{name} now traces for every size: move it out of FIXED_SIZE_TRACE (and fix the README)"


def test_sdpa_trace_follows_the_head_size():
    # the default scale 1/√E was a Python float frozen at the traced E: silently wrong at another E
    from layerlab.layers.attention import ScaledDotProductAttention

    layer = ScaledDotProductAttention()
    q = torch.randn(2, 4, 10, 8)
    traced = torch.jit.trace(layer, (q, q, q))
    q7 = torch.randn(2, 4, 9, 7)
    torch.testing.assert_close(_first(traced(q7, q7, q7)),
                               torch.nn.functional.scaled_dot_product_attention(q7, q7, q7))

"""Hypothesis fuzz of the spec loader, in-process: any text, bytes or YAML structure becomes a
:class:`~layerlab.spec.schema.Spec` or a :class:`~layerlab.errors.LayerlabError`, never another
exception, within a deadline. Nothing is built or run (and ``allow_import`` is never given, so no
user code is imported): the loader must decide on its own.
"""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="the fuzz tests need hypothesis")
yaml = pytest.importorskip("yaml", reason="specs are YAML")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from layerlab.errors import LayerlabError  # noqa: E402
from layerlab.spec import load_spec, parse_spec_text  # noqa: E402
from layerlab.spec.schema import INPUT_KEYS, ITEM_KEYS, TOP_KEYS, Spec  # noqa: E402

FUZZ = settings(max_examples=120, deadline=timedelta(seconds=3), derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

LAYERS = ["Conv2d", "Linear", "ReLU", "MultiheadAttention", "GRU", "conv2d", "linear", "patch_embedding",
          "Conv2", "nn.Linear", "torch.nn:Linear", "os:system", "./x.py:Layer", ""]
KEYS = list(TOP_KEYS) + list(ITEM_KEYS) + list(INPUT_KEYS) + [
    "in_channels", "out_channels", "kernel_size", "in_features", "out_features", "embed_dim", "num_heads",
    "query", "key", "value", "attn_mask", "atn_mask", "x", "batch_dims", "reference", "lyaer", "shap"]
BIG_INTS = st.sampled_from([0, 1, -1, 2, 3, 2**31, 2**62, 2**63, 2**64, 10**26, -2**70])
SCALARS = st.one_of(st.none(), st.booleans(), BIG_INTS, st.integers(-10, 64),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                    st.sampled_from(LAYERS + KEYS + ["float32", "meta", "cuda", "mps", "train", "eval", "same"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=5)),
    max_leaves=25)


def _shape():
    return st.lists(st.one_of(st.integers(-2, 9), BIG_INTS, SCALARS), min_size=0, max_size=5)


SPECS = st.fixed_dictionaries(
    {"layer": st.sampled_from(LAYERS)},
    optional={
        "args": st.dictionaries(st.sampled_from(KEYS), st.one_of(st.integers(-2, 9), SCALARS, _shape()), max_size=4),
        "input": st.one_of(_shape(), st.fixed_dictionaries({"shape": _shape()}, optional={
            "dtype": SCALARS, "low": SCALARS, "high": SCALARS, "init": SCALARS, "device": SCALARS})),
        "inputs": st.dictionaries(st.sampled_from(KEYS), st.one_of(
            _shape(), VALUES, st.fixed_dictionaries({"same_as": st.sampled_from(KEYS)}),
            st.fixed_dictionaries({"causal": st.one_of(st.integers(-1, 8), BIG_INTS)})), max_size=3),
        "seed": SCALARS, "dtype": SCALARS, "device": SCALARS, "mode": SCALARS, "backward": SCALARS, "name": VALUES,
        "block": st.lists(st.one_of(st.sampled_from(LAYERS), st.fixed_dictionaries(
            {"layer": st.sampled_from(LAYERS)}, optional={"repeat": SCALARS, "name": SCALARS, "args": VALUES})),
            max_size=4),
    },
)
TOKENS = st.sampled_from([
    "[", "]", "{", "}", ":", ": ", ", ", "- ", "\n", "\n  ", "  ", "&a ", "*a", "&b ", "*b", "<<: ", "? ",
    "!!python/object/apply:os.system ", "!!binary ", "!x ", "|", ">", "'", '"', "#", "---", "...", "%YAML 1.1\n",
    "\x00", "\ufeff", "\x1b[31m", "\t", "\r", "~", ".nan", ".inf", "0x1F", "1e400", "99999999999999999999",
    "layer", "Conv2d", "args", "input", "inputs", "shape", "block", "repeat", "seed", "name", "device",
])


def _load(text: str):
    try:
        result = parse_spec_text(text, filename="fuzz.yaml")
    except LayerlabError as exc:
        assert exc.exit_code in (1, 2) and exc.message
        return None
    assert isinstance(result, Spec)
    return result


@FUZZ
@given(SPECS)
def test_structured_specs_load_or_refuse(data):
    _load(yaml.safe_dump(data, allow_unicode=True))


@FUZZ
@given(VALUES)
def test_random_structures_load_or_refuse(data):
    _load(yaml.safe_dump(data, allow_unicode=True))


@FUZZ
@given(st.lists(TOKENS, max_size=60).map("".join))
def test_yaml_ish_text_loads_or_refuses(text):
    _load(text)


@FUZZ
@given(st.binary(max_size=400) | st.lists(TOKENS, max_size=40).map(lambda t: "".join(t).encode("utf-8", "surrogatepass")))
def test_spec_files_of_any_bytes_load_or_refuse(data):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "fuzz.yaml")
        with open(path, "wb") as f:
            f.write(data)
        try:
            assert isinstance(load_spec(path), Spec)
        except LayerlabError as exc:
            assert exc.exit_code in (1, 2) and exc.message

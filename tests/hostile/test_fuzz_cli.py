"""Hypothesis fuzz of the command-line options, in-process through the CLI's entry point
:func:`layerlab.cli.app.main` (its error boundary is what a user meets): every option list ends
in exit 0, 1 or 2, no exception escapes, ``--json`` output is JSON, and each call stays within a
deadline. ``explain-shape`` is pure arithmetic, so it gets many examples; the other commands run
a tiny registry layer with few examples. ``profile --threads`` with huge values is left to the
subprocess corpus (``threads_100000``): in-process it would resize this process's thread pool.
"""

from __future__ import annotations

import contextlib
import io
from datetime import timedelta

import pytest

pytest.importorskip("hypothesis", reason="the fuzz tests need hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from layerlab.cli.app import main  # noqa: E402
from tests.hostile.verdict import CONTROL, json_documents  # noqa: E402

OPS = ["conv", "conv1d", "conv2d", "conv3d", "conv_transpose", "conv_transpose2d", "max_pool", "max_pool1d",
       "avg_pool", "avg_pool2d", "lp_pool", "lp_pool1d", "adaptive_avg_pool", "adaptive_max_pool", "unfold", "fold",
       "upsample", "pixel_shuffle", "pixel_unshuffle", "flatten", "patch_embed", "F.conv1d", "maxpool", "nope", ""]
INTS = st.one_of(st.integers(-3, 12), st.sampled_from([0, 2**31, 2**62, 2**63, 10**26, 10**6, 10**7]))
INT_TEXT = INTS.map(str) | st.sampled_from(["3x5", "1x1x1", "2,3", "-1x2", "x", "", "nan", "1e3", "3.5", "٣"])
SIZES = st.one_of(INT_TEXT, st.sampled_from(["32", "32x48", "2,3,32,32", "1,1,5", "3,224,224", "0", "7x7x7x7",
                                             "2,3,4,5,6,7", "1," * 30 + "1", "none"]))
FLOATS = st.sampled_from(["2", "0.29", "0", "-1", "nan", "inf", "1e9", "1e-300", "abc"])
CHAINS = st.lists(st.sampled_from(["conv k=7 s=2 p=3", "maxpool k=3 s=2 p=1", "conv k=3", "avgpool k=2",
                                   "flatten", "conv k=0", "bogus z=1", "conv k=1e9", ""]), max_size=4).map(" | ".join)


def _opt(name, values):
    return st.tuples(st.just(name), values).map(list)


EXPLAIN_OPTS = st.lists(st.one_of(
    _opt("--op", st.sampled_from(OPS)), _opt("--input", SIZES), _opt("--kernel-size", INT_TEXT),
    _opt("--stride", INT_TEXT), _opt("--padding", INT_TEXT | st.sampled_from(["same", "valid", "SAME"])),
    _opt("--dilation", INT_TEXT), _opt("--groups", INT_TEXT), _opt("--in-channels", INT_TEXT),
    _opt("--out-channels", INT_TEXT), _opt("--padding-mode", st.sampled_from(["zeros", "reflect", "circular", "x"])),
    _opt("--output-padding", INT_TEXT), _opt("--output-size", SIZES), _opt("--divisor-override", INT_TEXT),
    _opt("--norm-type", FLOATS), _opt("--size", SIZES), _opt("--scale-factor", FLOATS),
    _opt("--mode", st.sampled_from(["nearest", "bilinear", "area", "bicubic", "linear", "x"])),
    _opt("--upscale-factor", INT_TEXT), _opt("--downscale-factor", INT_TEXT), _opt("--start-dim", INT_TEXT),
    _opt("--end-dim", INT_TEXT), _opt("--patch-size", INT_TEXT), _opt("--embed-dim", INT_TEXT),
    _opt("--target", SIZES), _opt("--undo", SIZES), _opt("--chain", CHAINS),
    _opt("--torch-version", st.sampled_from(["2.13.0", "1.0", "99.0.0", "x.y"])),
    st.sampled_from([["--ceil-mode"], ["--return-indices"], ["--no-count-include-pad"], ["--align-corners"]]),
), max_size=6).map(lambda groups: [arg for group in groups for arg in group])

DEVICES = st.sampled_from(["cpu", "meta", "cuda", "cuda:3", "mps", "xla", "gpu", "", "\x1b[31m"])
SEEDS = st.sampled_from(["0", "1", "-1", str(2**63 - 1), str(2**63), str(2**70), "x"])
INSPECT_OPTS = st.lists(st.one_of(
    _opt("--seed", SEEDS), _opt("--device", DEVICES),
    _opt("--dtype", st.sampled_from(["float32", "float64", "bfloat16", "float16", "int64", "fp8", "double"])),
    _opt("--mode", st.sampled_from(["train", "eval", "test"])), _opt("--depth", INT_TEXT),
    _opt("--input-shape", st.sampled_from(["8,64", "input=8,64", "x=8,64", "0,64", "8,63", "-1,64", "8", "a,b",
                                           "2,3,32", "99999999999999999999,64"])),
    st.sampled_from([["--no-backward"], ["--wide"], ["--ops"], ["--no-fix"]]),
), max_size=4).map(lambda groups: [arg for group in groups for arg in group])
GRADCHECK_OPTS = st.lists(st.one_of(
    _opt("--seed", SEEDS), _opt("--slow-cap", INT_TEXT),
    _opt("--only", st.sampled_from(["runs", "gradcheck", "runs,forward_parity", "gradchek", "", ",,", "compile"])),
    st.sampled_from([["--verbose"], ["--no-auto-reference"]]),
), max_size=3).map(lambda groups: [arg for group in groups for arg in group])
PROFILE_OPTS = st.lists(st.one_of(
    _opt("--seed", SEEDS), _opt("--device", DEVICES), _opt("--repeats", st.sampled_from(["1", "2", "0", "-1", "x"])),
    _opt("--warmup", st.sampled_from(["0", "1", "-1"])), _opt("--threads", st.sampled_from(["1", "2", "0", "-3"])),
    _opt("--depth", INT_TEXT), _opt("--top", INT_TEXT),
), max_size=3).map(lambda groups: [arg for group in groups for arg in group])
EXPORT_OPTS = st.lists(st.one_of(
    _opt("--seed", SEEDS), _opt("--device", DEVICES),
    _opt("--paths", st.sampled_from(["trace", "trace,script", "export", "tarce", "", "trace,trace"])),
    _opt("--rtol", FLOATS), _opt("--atol", FLOATS), st.just(["--strict"]),
), max_size=3).map(lambda groups: [arg for group in groups for arg in group])


def invoke(argv):
    """``main(argv)`` with stdout and stderr captured → (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def check(argv, json_mode):
    code, out, err = invoke(argv + (["--json"] if json_mode else []))
    assert code in (0, 1, 2), (argv, code, err[-2000:])
    assert "Traceback" not in err, (argv, err[-2000:])
    assert not CONTROL.search(out + err), (argv, "raw control character in the output")
    if json_mode:
        assert json_documents(err) is not None, (argv, "stderr is not JSON", err[:500])
        docs = json_documents(out)
        assert docs is not None and len(docs) <= 1, (argv, "stdout is not one JSON document", out[:500])
        if code == 2:
            assert not docs and json_documents(err), (argv, "a refusal under --json needs an error object", err[:500])
    elif code == 2:
        assert err.strip(), (argv, "exit 2 with nothing on stderr")


def _settings(examples, seconds):
    return settings(max_examples=examples, deadline=timedelta(seconds=seconds), derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@_settings(300, 5)
@given(EXPLAIN_OPTS, st.booleans())
def test_explain_shape_options(argv, json_mode):
    check(["explain-shape", *argv], json_mode)


@_settings(30, 20)
@given(INSPECT_OPTS, st.booleans())
def test_inspect_options_on_a_registry_layer(argv, json_mode):
    check(["inspect", "linear", *argv], json_mode)


@_settings(15, 30)
@given(GRADCHECK_OPTS, st.booleans())
def test_gradcheck_options_on_a_registry_layer(argv, json_mode):
    check(["gradcheck", "avg_pool1d", *argv], json_mode)


@_settings(15, 20)
@given(PROFILE_OPTS, st.booleans())
def test_profile_options_on_a_registry_layer(argv, json_mode):
    check(["profile", "avg_pool1d", *argv], json_mode)


@_settings(12, 30)
@given(EXPORT_OPTS, st.booleans())
def test_export_check_options_on_a_registry_layer(argv, json_mode):
    check(["export-check", "avg_pool1d", *argv], json_mode)


# Hostile explain-shape questions from issue 11 (items 5, 6 and the int64 limits), each checked
# for the contract above and for time; the padding limit also against real torch.
ISSUE_QUESTIONS = [
    ["--op", "conv_transpose", "--padding", "same", "--target", "32", "--input", "16", "--kernel-size", "3"],
    ["--op", "conv_transpose", "--padding", "valid", "--undo", "32", "--input", "16", "--kernel-size", "3"],
    ["--op", "max_pool1d", "--input", "100", "--kernel-size", str(10**7), "--target", "10"],
    ["--op", "conv1d", "--input", str(2**40), "--kernel-size", "3"],
    ["--op", "lp_pool1d", "--input", "32", "--kernel-size", "2", "--target", "16"],
    ["--input", "32", "--kernel-size", "3", "--padding", "0", "--target", "32"],
]


@pytest.mark.parametrize("argv", ISSUE_QUESTIONS, ids=lambda a: " ".join(a)[:60])
@pytest.mark.parametrize("json_mode", [False, True], ids=["human", "json"])
def test_explain_shape_issue_questions_answer_quickly(argv, json_mode):
    import time

    start = time.perf_counter()
    check(["explain-shape", *argv], json_mode)
    assert time.perf_counter() - start < 5.0, argv


def test_explain_shape_padding_beyond_int64_limit_agrees_with_torch():
    """torch refuses padding > 2**62 - 1 before allocating; explain-shape must say torch raises."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    with pytest.raises(RuntimeError, match="expected padding to be at most"):
        F.conv2d(torch.randn(1, 1, 32, 32), torch.randn(1, 1, 3, 3), padding=2**62)
    code, out, err = invoke(["explain-shape", "--op", "conv2d", "--input", "1,1,32,32", "--kernel-size", "3",
                             "--padding", str(2**62), "--json"])
    assert code == 1, (code, out[:500], err[:500])

"""Fuzzing explain-shape's command line: whatever the options, exit 0, 1 or 2, no traceback, fast.

The CLI is run in-process (no torch is needed: explain-shape never imports it)."""

import contextlib
import io
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerlab.cli.app import main

_OPS = ["conv", "conv1d", "conv3d", "conv_transpose", "max_pool", "max_pool1d", "avg_pool", "avg_pool3d", "lp_pool",
        "adaptive_avg_pool", "adaptive_max_pool1d", "unfold", "fold", "upsample", "pixel_shuffle",
        "pixel_unshuffle", "flatten", "patch_embed", "nope", "F.conv1d"]
_INT = st.one_of(st.integers(-3, 40), st.sampled_from([0, 2**31, 2**62, 2**63, 10**7, -2**63]))
_TUPLE = st.one_of(_INT.map(str), st.lists(st.integers(-2, 9), min_size=1, max_size=4).map(
    lambda xs: "x".join(map(str, xs))), st.sampled_from(["", "abc", "3x", "(1, 2)", "none", "1e3", "nan"]))
_OPTIONS = {
    "--input": st.one_of(_TUPLE, st.sampled_from(["2,3,32,32", "0,1,8", "1,1,0,5", "224", "5,5"])),
    "--kernel": _TUPLE, "--stride": _TUPLE, "--padding": st.one_of(_TUPLE, st.sampled_from(["same", "valid", "full"])),
    "--dilation": _TUPLE, "--groups": _INT.map(str), "--in-channels": _INT.map(str),
    "--out-channels": _INT.map(str), "--output-padding": _TUPLE, "--output-size": _TUPLE,
    "--padding-mode": st.sampled_from(["zeros", "reflect", "replicate", "circular", "bogus"]),
    "--divisor-override": _INT.map(str), "--norm-type": st.sampled_from(["2", "0", "inf", "-1", "nan", "x"]),
    "--size": _TUPLE, "--scale-factor": st.sampled_from(["2", "0.29", "1e9", "1e30", "-1", "nan", "inf", "x"]),
    "--mode": st.sampled_from(["nearest", "bilinear", "area", "bicubic", "lanczos", "x"]),
    "--upscale-factor": _INT.map(str), "--downscale-factor": _INT.map(str), "--start-dim": _INT.map(str),
    "--end-dim": _INT.map(str), "--patch-size": _INT.map(str), "--embed-dim": _INT.map(str),
    "--target": _TUPLE, "--undo": _TUPLE, "--torch-version": st.sampled_from(["2.13.0", "2.14.1", "x", "3"]),
    "--chain": st.sampled_from(["conv k=3 | maxpool k=2", "conv1d k=3 s=2", "bogus", "", "conv k=x",
                                "conv k=3 -> flatten", "maxpool k=1e7 | conv k=3"]),
}
_FLAGS = ["--ceil-mode", "--return-indices", "--count-include-pad", "--no-count-include-pad", "--align-corners",
          "--json"]


@st.composite
def _argv(draw):
    args = ["explain-shape", "--op", draw(st.sampled_from(_OPS))]
    for name in draw(st.lists(st.sampled_from(sorted(_OPTIONS)), max_size=6, unique=True)):
        args += [name, draw(_OPTIONS[name])]
    args += draw(st.lists(st.sampled_from(_FLAGS), max_size=2, unique=True))
    return args


@settings(max_examples=150, deadline=5000, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(argv=_argv())
def test_explain_shape_cli_never_crashes(argv):
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)  # an unexpected exception propagates and fails the test: a traceback
    elapsed = time.perf_counter() - start
    text = out.getvalue() + err.getvalue()
    assert code in (0, 1, 2), (argv, code, text)
    assert "Traceback" not in text, (argv, text)
    assert elapsed < 4.0, (argv, elapsed)

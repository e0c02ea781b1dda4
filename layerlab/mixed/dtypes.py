"""The facts about half precision that every verdict of precision-check rests on, in one place.

============  ==========  ===============  ====================  ===================
dtype         eps (2⁻ᵖ)   largest finite   smallest normal       smallest subnormal
============  ==========  ===============  ====================  ===================
float16       2⁻¹⁰        65504            2⁻¹⁴ ≈ 6.1e-5         2⁻²⁴ ≈ 6.0e-8
bfloat16      2⁻⁷         ≈ 3.4e38         ≈ 1.2e-38             ≈ 9.2e-41
============  ==========  ===============  ====================  ===================

A value above the largest finite one becomes ``inf`` (overflow); a gradient below the smallest
subnormal becomes exactly 0 (underflow: it is *flushed*, the case a GradScaler exists for); one
between the two is kept with fewer significant bits (subnormal: precision lost, not the value).

Thresholds are multiples of the dtype's ``eps`` (:class:`Tolerance`), so one rule serves both
dtypes: rounding an input to bf16 costs a relative error of at most ``eps/2`` per element, a
matrix product with float32 accumulation adds about as much again, and a stack of modules adds up
(see :data:`OUTPUT_EPS` for the calibration).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from layerlab.errors import UsageError

#: the half-precision dtypes precision-check runs, by the names the CLI and specs take
HALF = {"float16": torch.float16, "bfloat16": torch.bfloat16}
ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "torch.float16": "float16",
           "torch.bfloat16": "bfloat16"}

FP16_MAX = float(torch.finfo(torch.float16).max)              # 65504
FP16_TINY = float(torch.finfo(torch.float16).smallest_normal)  # 2⁻¹⁴: below it, subnormal
FP16_SUBNORMAL = 2.0 ** -24                                     # below half of it: flushed to 0

#: A module's output is "losing precision" when its relative error against float32 is above
#: OUTPUT_EPS × eps *and* GAIN × the error its inputs already carried (its own computation, not
#: inherited error). Calibration (CPU, torch 2.13, bf16 and fp16 autocast): over the 85 stock
#: torch.nn configs of tests/checks/stock_configs.py, every configs/ example and Hugging Face
#: GPT-2/BERT/Llama from tiny configs, per-module output errors stay ≤ 0.9·eps; the planted bugs
#: (configs/precision_layers.py: a sum of squares, softmax of logits near 1000, an activation past
#: 65504) reach 90·eps to inf. 8 leaves about ×9 on the healthy side and ×10 on the other.
OUTPUT_EPS = 8.0
GAIN = 4.0
#: Parameter gradients go through the whole backward (every module after the parameter) and carry
#: more accumulated error: healthy models measured ≤ 4.7·eps (85 stock configs), up to 11·eps on a
#: 4-layer post-LN encoder stack. A gradient above the bar is a warning naming it, never a failure.
GRAD_EPS = 32.0
#: The share of a gradient's norm lost to underflow that makes a finding (elements, by norm:
#: the noise of a gradient that is exactly zero in exact arithmetic carries none).
UNDERFLOW_FRACTION = 0.01


@dataclass(frozen=True)
class Tolerance:
    """The bars one half dtype is held to (``eps`` is ``torch.finfo(dtype).eps``)."""

    dtype: str
    eps: float
    output: float
    gain: float
    grad: float

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "eps": self.eps, "output": self.output, "gain": self.gain, "grad": self.grad,
                "rule": f"output error > {OUTPUT_EPS:g}·eps and > {GAIN:g}× the input's error; "
                        f"parameter gradient error > {GRAD_EPS:g}·eps"}


def tolerance(dtype: str, scale: float = 1.0) -> Tolerance:
    """The bars for ``dtype`` (``scale`` multiplies the error bars: the spec's ``tolerance_scale``)."""
    eps = float(torch.finfo(HALF[dtype]).eps)
    return Tolerance(dtype=dtype, eps=eps, output=OUTPUT_EPS * eps * scale, gain=GAIN, grad=GRAD_EPS * eps * scale)


def half_name(value: str, where: str) -> str:
    """``"bf16"`` → ``"bfloat16"``; anything but float16/bfloat16 is a usage error."""
    name = ALIASES.get(str(value).strip().lower(), str(value).strip().lower())
    if name not in HALF:
        raise UsageError(f"{where} takes float16 or bfloat16, got {value!r}", where=where,
                         expected="float16 | bfloat16", got=value,
                         hint="float32 is the reference every run is compared with")
    return name


def half_names(values: Sequence[str], where: str) -> List[str]:
    """Several dtypes (a list, or comma-separated text), each once, in the order given."""
    out: List[str] = []
    for value in values:
        for part in str(value).split(","):
            if part.strip():
                name = half_name(part, where)
                if name not in out:
                    out.append(name)
    return out


def autocast_supported(device_type: str, dtype: str) -> Optional[str]:
    """``None`` when ``torch.autocast(device_type, dtype)`` runs here, else why not (one line).

    Asked of torch itself: entering the context is what raises (or warns and disables it) where a
    dtype is not supported, e.g. float16 on the CPU of older torch releases."""
    import warnings

    if not torch.amp.is_autocast_available(device_type):
        return f"torch {torch.__version__} has no autocast for {device_type}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.autocast(device_type, dtype=HALF[dtype]):
                enabled = torch.is_autocast_enabled(device_type)
        except (RuntimeError, ValueError) as exc:
            return str(exc).splitlines()[0]
    if not enabled:
        return str(caught[0].message).splitlines()[0] if caught else f"autocast({device_type}, {dtype}) is disabled"
    return None


def default_autocast(device_type: str) -> List[str]:
    """What runs when nothing is asked: bf16 on CPU (its fast path; fp16 on request); fp16 and bf16
    on CUDA (the two dtypes people train in there)."""
    if device_type == "cuda":
        return ["float16", "bfloat16"] if torch.cuda.is_bf16_supported() else ["float16"]
    return ["bfloat16"]

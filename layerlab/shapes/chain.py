"""A chain of ops, each fed by the previous output: ``224 → conv k7 s2 p3 → maxpool k3 s2 p1 → 56``.

Syntax (one string, stages separated by ``|`` or ``->``)::

    conv k=7 s=2 p=3 out=64 | maxpool k=3 s=2 p=1 | adaptive_avg_pool o=1 | flatten

A stage is an op name (any spelling :func:`layerlab.shapes.ops.resolve` accepts; ``conv`` picks
``conv2d`` for a 2-D input) followed by ``key=value`` pairs. Keys are torch's argument names or
the short forms in :data:`SHORT_KEYS`; values are ints, tuples (``3x5``), ``same``/``valid``,
floats, ``true``/``false``/``none``; a bare word such as ``ceil`` means ``ceil_mode=true``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from layerlab.errors import UsageError
from layerlab.shapes import explain
from layerlab.shapes.ops import resolve
from layerlab.shapes.result import Explanation

SHORT_KEYS = {
    "k": "kernel_size", "kernel": "kernel_size", "s": "stride", "p": "padding", "pad": "padding",
    "d": "dilation", "g": "groups", "opad": "output_padding", "out": "out_channels",
    "in": "in_channels", "c": "out_channels", "o": "output_size", "sf": "scale_factor",
    "scale": "scale_factor", "r": None,  # r: the pixel (un)shuffle factor, resolved per op
    "patch": "patch_size", "dim": "embed_dim",
}
BARE_FLAGS = {"ceil": ("ceil_mode", True), "indices": ("return_indices", True)}

_SPLIT = re.compile(r"\s*(?:\||->|→)\s*")


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    if low in ("same", "valid") or re.fullmatch(r"[a-z_-]+", low):
        return text
    parts = re.split(r"[x×,]", text.strip("()"))
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        try:
            nums = [float(p) for p in parts]
        except ValueError:
            raise UsageError(f"cannot read the value {text!r}", where="--chain", hint="use ints, 3x5, same, 1.5, true") from None
    return nums[0] if len(nums) == 1 else tuple(nums)


@dataclass
class Stage:
    """One parsed stage: the op as written, and its parameters with torch's names."""

    text: str
    op: str
    params: Dict[str, Any] = field(default_factory=dict)


def parse_chain(text: str) -> List[Stage]:
    """Split a chain string into stages (see the module docstring for the syntax)."""
    stages = []
    for i, chunk in enumerate(s for s in _SPLIT.split(text.strip()) if s):
        words = chunk.split()
        op, params = words[0], {}
        for word in words[1:]:
            if "=" not in word:
                if word.lower() in BARE_FLAGS:
                    key, value = BARE_FLAGS[word.lower()]
                    params[key] = value
                    continue
                raise UsageError(
                    f"stage {i + 1} ({chunk!r}): expected key=value, got {word!r}",
                    where="--chain",
                    hint="write e.g. 'conv k=3 s=2 p=1 | maxpool k=2'",
                )
            key, _, raw = word.partition("=")
            name = SHORT_KEYS.get(key, key)
            if name is None:  # 'r' depends on the op
                name = "downscale_factor" if "unshuffle" in op.lower() else "upscale_factor"
            params[name] = _value(raw)
        stages.append(Stage(chunk, op, params))
    if not stages:
        raise UsageError("--chain is empty", where="--chain", hint="e.g. --chain 'conv k=3 s=2 | maxpool k=2'")
    return stages


@dataclass
class ChainResult:
    """Each stage's explanation in order; ``output_shape`` is None if a stage would raise."""

    input_shape: Tuple[int, ...]
    stages: List[Explanation]
    output_shape: Optional[Tuple[int, ...]]

    @property
    def ok(self) -> bool:
        return self.output_shape is not None

    def to_dict(self) -> dict:
        from layerlab.shapes.result import SCHEMA_VERSION

        return {
            "schema": SCHEMA_VERSION,
            "kind": "chain",
            "input_shape": list(self.input_shape),
            "output_shape": None if self.output_shape is None else list(self.output_shape),
            "ok": self.ok,
            "stages": self.stages,
        }


def explain_chain(input_shape: Sequence[int], stages: Sequence[Stage],
                  torch_version: Optional[str] = None) -> ChainResult:
    """Run the stages in order; stop at the first one torch would reject (``torch_version``: see
    :func:`layerlab.shapes.explain`)."""
    shape = tuple(int(x) for x in input_shape)
    results: List[Explanation] = []
    for stage in stages:
        resolve(stage.op, n_spatial=max(len(shape) - 2, 1))  # unknown names → UsageError first
        ex = explain(stage.op, shape, torch_version=torch_version, **stage.params)
        results.append(ex)
        if ex.output_shape is None:
            return ChainResult(tuple(input_shape), results, None)
        shape = ex.output_shape
    return ChainResult(tuple(input_shape), results, shape)

"""The table of ops explain-shape knows: canonical names, aliases, torch.nn classes, defaults.

Each op is implemented by one function ``explain(ex, spec, shape, params)`` in the family's
module (``layerlab/shapes/<family>.py``). That function appends :class:`DimStep` s and
:class:`ShapeNote` s to ``ex``, sets ``ex.output_shape``, and raises
:class:`~layerlab.errors.TorchWouldRaise` exactly where torch would raise (with torch's own
message). ``params`` arrive with the defaults below filled in, using torch's argument names.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

from layerlab.errors import UsageError


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: Marks a parameter the user must give.
REQUIRED: Any = _Required()


@dataclass(frozen=True)
class OpSpec:
    """One op: ``name`` (canonical, functional-style), its ``family`` and number of spatial dims.

    ``functional``: the op as ``torch.nn.functional`` runs it (no module constructor and its
    ValueErrors; the functional's own checks and messages). Asked for by an ``F.`` prefix.
    """

    name: str
    family: str
    nd: Optional[int]
    torch_name: str
    defaults: Dict[str, Any] = field(default_factory=dict)
    functional: bool = False

    @property
    def key(self) -> str:
        """The name that resolves back to this very spec (``F.conv2d`` for a functional one)."""
        return f"F.{self.name}" if self.functional else self.name

    @property
    def explain_fn(self) -> Callable:
        module = importlib.import_module(f"layerlab.shapes.{self.family}")
        return getattr(module, "explain")


def _conv_defaults() -> Dict[str, Any]:
    return dict(
        in_channels=None, out_channels=None, kernel_size=REQUIRED, stride=1, padding=0,
        dilation=1, groups=1, padding_mode="zeros",
    )


def _conv_t_defaults() -> Dict[str, Any]:
    return dict(
        in_channels=None, out_channels=None, kernel_size=REQUIRED, stride=1, padding=0,
        output_padding=0, groups=1, dilation=1, padding_mode="zeros", output_size=None,
    )


#: The padding modules (``nn.ReflectionPad2d`` …): op name prefix → class name prefix.
_PAD_MODULES = {"reflection": "Reflection", "replication": "Replication", "zero": "Zero",
                "circular": "Circular", "constant": "Constant"}


def _build_table() -> Dict[str, OpSpec]:
    ops = []
    for nd in (1, 2, 3):
        ops += [
            OpSpec(f"conv{nd}d", "conv", nd, f"nn.Conv{nd}d", _conv_defaults()),
            OpSpec(f"conv_transpose{nd}d", "conv_transpose", nd, f"nn.ConvTranspose{nd}d", _conv_t_defaults()),
            OpSpec(
                f"max_pool{nd}d", "pool", nd, f"nn.MaxPool{nd}d",
                dict(kernel_size=REQUIRED, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False),
            ),
            OpSpec(
                f"avg_pool{nd}d", "pool", nd, f"nn.AvgPool{nd}d",
                dict(kernel_size=REQUIRED, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                     **({} if nd == 1 else {"divisor_override": None})),
            ),
            OpSpec(
                f"lp_pool{nd}d", "pool", nd, f"nn.LPPool{nd}d",
                dict(norm_type=2.0, kernel_size=REQUIRED, stride=None, ceil_mode=False),
            ),
            OpSpec(f"adaptive_avg_pool{nd}d", "adaptive", nd, f"nn.AdaptiveAvgPool{nd}d", dict(output_size=REQUIRED)),
            OpSpec(
                f"adaptive_max_pool{nd}d", "adaptive", nd, f"nn.AdaptiveMaxPool{nd}d",
                dict(output_size=REQUIRED, return_indices=False),
            ),
        ]
        for kind, cls in _PAD_MODULES.items():
            defaults = dict(padding=REQUIRED, value=0.0) if kind == "constant" else dict(padding=REQUIRED)
            ops.append(OpSpec(f"{kind}_pad{nd}d", "pad", nd, f"nn.{cls}Pad{nd}d", defaults))
    ops += [
        OpSpec("unfold", "fold", 2, "nn.Unfold", dict(kernel_size=REQUIRED, dilation=1, padding=0, stride=1)),
        OpSpec("fold", "fold", 2, "nn.Fold",
               dict(output_size=REQUIRED, kernel_size=REQUIRED, dilation=1, padding=0, stride=1)),
        OpSpec("upsample", "upsample", None, "nn.Upsample",
               dict(size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None)),
        OpSpec("pixel_shuffle", "pixel_shuffle", None, "nn.PixelShuffle", dict(upscale_factor=REQUIRED)),
        OpSpec("pixel_unshuffle", "pixel_shuffle", None, "nn.PixelUnshuffle", dict(downscale_factor=REQUIRED)),
        OpSpec("flatten", "flatten", None, "nn.Flatten", dict(start_dim=1, end_dim=-1)),
        OpSpec("fractional_max_pool2d", "fractional", 2, "nn.FractionalMaxPool2d",
               dict(kernel_size=REQUIRED, output_size=None, output_ratio=None, return_indices=False)),
        OpSpec("fractional_max_pool3d", "fractional", 3, "nn.FractionalMaxPool3d",
               dict(kernel_size=REQUIRED, output_size=None, output_ratio=None, return_indices=False)),
        OpSpec("patch_embed", "patch", 2, "PatchEmbed (Conv2d, kernel = stride = patch)",
               dict(patch_size=REQUIRED, in_channels=None, embed_dim=768, flatten=True)),
    ]
    return {op.name: op for op in ops}


OPS: Dict[str, OpSpec] = _build_table()

#: Family names that pick their ``…1d/2d/3d`` variant from the input's number of spatial dims.
FAMILIES = {
    "conv": "conv{nd}d",
    "conv_transpose": "conv_transpose{nd}d",
    "max_pool": "max_pool{nd}d",
    "avg_pool": "avg_pool{nd}d",
    "lp_pool": "lp_pool{nd}d",
    "adaptive_avg_pool": "adaptive_avg_pool{nd}d",
    "adaptive_max_pool": "adaptive_max_pool{nd}d",
    "fractional_max_pool": "fractional_max_pool{nd}d",
    **{f"{kind}_pad": f"{kind}_pad{{nd}}d" for kind in _PAD_MODULES},
}

_EXTRA_ALIASES = {
    "convt": "conv_transpose", "deconv": "conv_transpose", "transposed_conv": "conv_transpose",
    "maxpool": "max_pool", "avgpool": "avg_pool", "lppool": "lp_pool", "pool": "max_pool",
    "interpolate": "upsample", "resize": "upsample",
    "patch": "patch_embed", "patch_embedding": "patch_embed", "vit_patch": "patch_embed",
    "patchembed": "patch_embed", "im2col": "unfold", "col2im": "fold",
    "reflect_pad": "reflection_pad", "replicate_pad": "replication_pad", "fractional_maxpool": "fractional_max_pool",
}


_FUNCTIONAL_PREFIXES = ("torch.nn.functional.", "nn.functional.", "functional.", "F.")


def is_functional_name(name: str) -> bool:
    """``F.conv2d``, ``torch.nn.functional.conv2d``: the caller asks for the functional's semantics."""
    return name.strip().startswith(_FUNCTIONAL_PREFIXES)


def _functional_spec(spec: OpSpec, asked: str) -> OpSpec:
    """``spec`` as ``torch.nn.functional`` runs it; UsageError where torch.nn.functional has no such op.

    The functional has no module arguments: no ``padding_mode`` (conv), no ``output_size``
    (conv_transpose: that is the module's forward argument). ``F.interpolate`` adds ``antialias``.
    For conv and conv_transpose, ``in_channels``/``out_channels``/``kernel_size``/``groups``
    describe the weight the caller passes: ``(out, in/groups, *k)`` resp. ``(in, out/groups, *k)``.
    """
    if spec.family in ("pad", "patch", "flatten"):
        fix = {"pad": "F.pad(x, pad, mode)", "patch": "F.conv2d with kernel = stride = patch",
               "flatten": "torch.flatten (start_dim=0) or nn.Flatten (start_dim=1)"}[spec.family]
        raise UsageError(f"torch.nn.functional has no {spec.name}", where="--op", got=asked,
                         hint=f"use {spec.torch_name.split(' ')[0]} (module semantics, --op {spec.name}) or {fix}")
    defaults = dict(spec.defaults)
    name = f"F.{spec.name}"
    if spec.family == "conv":
        defaults.pop("padding_mode")
    elif spec.family == "conv_transpose":
        defaults.pop("padding_mode")
        defaults.pop("output_size")
    elif spec.family == "upsample":
        defaults["antialias"] = False
        name = "F.interpolate"
    if spec.family in ("conv", "conv_transpose"):
        w = "out_channels × in_channels/groups" if spec.family == "conv" else "in_channels × out_channels/groups"
        name += f" (weight: {w} × kernel_size)"
    return OpSpec(spec.name, spec.family, spec.nd, name, defaults, functional=True)


def _key(name: str) -> str:
    n = name.strip()
    for prefix in ("torch.nn.functional.", "torch.nn.", "nn.functional.", "functional.", "nn.", "F."):
        if n.startswith(prefix):
            n = n[len(prefix):]
            break
    return n.lower().replace("_", "").replace("-", "")


_LOOKUP: Dict[str, str] = {}
for _name in list(OPS) + list(FAMILIES):
    _LOOKUP[_key(_name)] = _name
for _alias, _target in _EXTRA_ALIASES.items():
    _LOOKUP[_key(_alias)] = _target
for _nd in (1, 2, 3):
    for _alias, _target in list(_EXTRA_ALIASES.items()):
        if _target in FAMILIES and FAMILIES[_target].format(nd=_nd) in OPS:
            _LOOKUP[_key(f"{_alias}{_nd}d")] = FAMILIES[_target].format(nd=_nd)


def all_names() -> list:
    return sorted(set(OPS) | set(FAMILIES))


def resolve(name: str, n_spatial: Optional[int] = None) -> OpSpec:
    """Find the op for ``name`` (any spelling: ``Conv2d``, ``nn.MaxPool2d``, ``max_pool``).

    A family name without ``1d/2d/3d`` takes ``n_spatial`` (the input's spatial dims).
    A ``F.`` / ``torch.nn.functional.`` prefix gives the functional's semantics (``OpSpec.functional``).
    Raises :class:`UsageError` with a did-you-mean for unknown names.
    """
    target = _LOOKUP.get(_key(name))
    if target is None:
        close = difflib.get_close_matches(_key(name), list(_LOOKUP), n=3, cutoff=0.6)
        hint = "did you mean " + " or ".join(repr(_LOOKUP[c]) for c in close) + "?" if close else None
        raise UsageError(
            f"unknown op {name!r}",
            where="--op",
            expected="one of " + ", ".join(all_names()),
            got=name,
            hint=hint,
        )
    if target in FAMILIES:
        nd = n_spatial if n_spatial in (1, 2, 3) else 2
        if FAMILIES[target].format(nd=nd) not in OPS:  # fractional_max_pool: 2d and 3d only
            nd = 2
        target = FAMILIES[target].format(nd=nd)
    if is_functional_name(name):
        return _functional_spec(OPS[target], name)
    return OPS[target]

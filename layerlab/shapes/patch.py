"""ViT patch embedding: ``Conv2d(C, embed_dim, kernel_size=P, stride=P)``, then (``flatten=True``)
``.flatten(2).transpose(1, 2)`` (shape_rules.md §11).

With ``k = s = P`` and no padding the conv formula is ``(H − P) // P + 1 = H // P``::

    (N, C, H, W) → (N, embed_dim, H // P, W // P) → (N, (H // P)·(W // P), embed_dim)

* ``H % P`` rows and ``W % P`` columns at the bottom/right are silently dropped (note
  ``patch-cropped``): 225×225 with P=16 gives 14×14 = 196 patches. Plain torch does not warn
  (timm's PatchEmbed asserts the size; that check is timm's, not torch's).
* ``H < P`` raises the conv's ``Calculated padded input size … Kernel size can't be greater than
  actual input size`` (§1.1); every other error is the conv's too (channels, rank, …).
* ``patch_size`` may be ``(P_h, P_w)``. An unbatched ``(C, H, W)`` input runs too, but
  ``flatten(2)`` then has nothing to merge and ``transpose(1, 2)`` swaps the grid: ``(D, W', H')``.
"""

from __future__ import annotations

from typing import Tuple

from layerlab.errors import UsageError
from layerlab.shapes import conv_core as core
from layerlab.shapes.conv import ConvAdvisor, input_channels, per_dim
from layerlab.shapes.result import DimStep, Explanation, ShapeNote


class PatchAdvisor(ConvAdvisor):
    """The conv's advice in PatchEmbed's own terms: ``patch_size`` (kernel = stride), ``embed_dim``;
    PatchEmbed has no padding, stride or groups to change."""

    _RENAME = (("kernel_size", "patch_size"), ("out_channels", "embed_dim"), ("nn.Conv2d", "PatchEmbed"))

    def __call__(self, check: str, data: dict) -> dict:
        info = super().__call__(check, data)
        keep = [s for s in info.get("suggestions", []) if not s.startswith(("padding", "stride", "groups"))]
        for old, new in self._RENAME:
            keep = [s.replace(old, new) for s in keep]
            for key in ("message", "where"):
                if isinstance(info.get(key), str):
                    info[key] = info[key].replace(old, new)
        if check == "kernel-too-big" and self.spatial:
            keep.append(f"an input of at least {max(data['effective'])} pixels per side")
        if "suggestions" in info:
            info["suggestions"] = keep
        return info


def explain(ex: Explanation, spec, shape: Tuple[int, ...], params: dict) -> None:
    """Conv2d(C, embed_dim, P, stride=P), then ``flatten(2).transpose(1, 2)`` if ``flatten``."""
    P = params["patch_size"]
    in_ch = params["in_channels"] if params["in_channels"] is not None else input_channels(shape, 2)
    dim = params["embed_dim"]
    for name, v in (("in_channels", in_ch), ("embed_dim", dim)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise UsageError(f"{name} must be an int", where=name, got=v)
    conv_params = dict(kernel_size=P, stride=P, padding=0, dilation=1, groups=1, padding_mode="zeros")
    advise = PatchAdvisor(2, shape, in_ch, dim, conv_params)
    m = core.construct(2, False, "Conv2d", in_ch, dim, P, P, 0, 1, 1, "zeros", advise=advise)
    p = per_dim(m.kernel_size, 2)
    if p is not None and len(shape) in (3, 4):
        for name, L, pi in zip(("H", "W"), shape[-2:], p):
            out = L // pi if pi > 0 else 0
            ex.steps.append(DimStep(name, L, f"({name} − P) // P + 1 = {name} // P", f"{L} // {pi}",
                                    out, {"k": pi, "s": pi, "p": 0, "d": 1, "E": pi}))
    xb, batched = core.batchify(shape, 2, "conv2d", advise)
    res = core.convolution(xb, m.weight, m.stride, m.padding, m.dilation, False, (0, 0), m.groups, advise)
    y = core.unbatch(res.shape, batched)
    if not params["flatten"]:
        ex.output_shape = y
    elif batched:
        n, d, h, w = y
        ex.steps.append(DimStep("patches", None, "(H // P) · (W // P)", f"{h} · {w}", h * w, {}))
        ex.output_shape = (n, h * w, d)
    else:
        d, h, w = y  # flatten(2) of a 3-D tensor merges nothing; transpose(1, 2) swaps h and w
        ex.output_shape = (d, w, h)
        ex.notes.append(ShapeNote(
            "info", "unbatched (C, H, W) input: flatten(2) has nothing to merge and transpose(1, 2) swaps the grid, "
                    f"giving (embed_dim, W', H') = {(d, w, h)}; add a batch dim for (1, num_patches, embed_dim)"))
    if p is None:
        return
    for name, L, pi in zip(("H", "W"), shape[-2:], p):
        rest = L % pi
        if rest:
            what = "row" if name == "H" else "column"
            first = L - rest
            which = f"{first}" if rest == 1 else f"{first}-{L - 1}"
            ex.notes.append(ShapeNote(
                "patch-cropped",
                f"{name}: {L} % {pi} = {rest}: the last {rest} {what}(s) ({which}) never fall in a patch and are "
                f"silently dropped; use {name} = {L - rest} or {L - rest + pi}, or pad the image",
                dim=name, data={"dropped": rest, "pixels": list(range(first, L))}))

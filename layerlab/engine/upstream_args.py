"""Upstream layer arguments that change no parameter: a conv's or pool's ``padding``/``stride``/
``ceil_mode``, a ConvTranspose's ``output_padding``.

The parameters as built are the author's intent. When a layer gets the wrong number of features
(a head's ``Linear(1024)`` fed 588 because a ``Conv3d`` upstream was built without
``padding=1``), resizing the layer is one reading; an upstream argument that makes the input
exactly the size the layer was built for, with every parameter's shape kept, is another, and it
ranks first (:class:`layerlab.engine.fix_search.Scored`).

No size is invented: only the values an author writes are tried (no padding, the size-keeping
padding ``(k − 1)/2`` of an odd kernel, stride 1, ``ceil_mode`` flipped, an ``output_padding``
below the stride), each on ONE copy of the model and
runs the forward only up to the failing layer (a pre-hook stops it there); a value is proposed
only where the failing layer's input then has exactly the size it was built for. At most
:data:`MAX_TRIES` values are tried, on the :data:`LAYERS_BACK` nearest conv/pool layers before
the failing one. The values are set as attributes the layer's forward reads (``set-attr``), so
the weights are kept.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch
import torch.nn as nn

from layerlab.probe.report import FixStep

#: The nearest conv/pool layers called before the failing one that are tried.
LAYERS_BACK = 4
#: At most this many (layer, argument, value) forwards are tried per failure.
MAX_TRIES = 16

_POOLS = (nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd)


class _Reached(Exception):
    """Raised by the pre-hook on the failing layer: the forward got there; the rest is not needed."""


def _expected(ctx) -> Optional[Tuple[int, int]]:
    """``(axis, size)`` the failing layer was built for, where its input's size on that axis differs."""
    from layerlab.engine.fix_search import _SIZE_ARGS

    m, xs = ctx.module, ctx.tensors()
    if m is None or not xs:
        return None
    x = xs[0]
    for cls, name, axis in _SIZE_ARGS:
        want = getattr(m, name, None)
        if isinstance(m, cls) and isinstance(want, int) and x.dim() > (axis if axis >= 0 else -axis - 1):
            if int(x.shape[axis]) != want:
                return axis, want
    return None


def _upstream_layers(ctx) -> List[Tuple[int, str, nn.Module]]:
    """``(steps back, path, module)``: the conv/pool layers called before the failing one, nearest first."""
    rec = ctx.recorder
    calls = getattr(rec, "calls", [])
    stop = next((i for i in range(len(calls) - 1, -1, -1) if calls[i].path == ctx.path), len(calls))
    found, seen = [], set()
    for i in range(stop - 1, -1, -1):
        path, module = calls[i].path, rec.modules[i]
        if path in seen or path == ctx.path or not path:
            continue
        if isinstance(module, (nn.modules.conv._ConvNd,) + _POOLS):
            seen.add(path)
            found.append((len(found) + 1, path, module))
            if len(found) >= LAYERS_BACK:
                break
    return found


def _same_padding(kernel, dilation=None) -> Optional[tuple]:
    """The padding that keeps the size at stride 1, ``d·(k − 1)/2`` per axis (odd kernels only)."""
    dilation = dilation or (1,) * len(kernel)
    if any(k % 2 == 0 for k in kernel):
        return None
    return tuple(d * (k - 1) // 2 for k, d in zip(kernel, dilation))


def _values(m: nn.Module) -> List[Tuple[str, Any, str]]:
    """``(attribute, value, code)`` to try on one layer: only the values an author writes (no
    padding, the size-keeping padding of an odd kernel, stride 1, ``ceil_mode`` flipped, an
    ``output_padding`` below the stride), never a value picked because it happens to fit."""
    out: List[Tuple[str, Any, str]] = []
    if isinstance(m, nn.modules.conv._ConvNd):
        if isinstance(m.padding, str) or m.padding_mode != "zeros":
            return out
        n = len(m.kernel_size)
        for pad in ((0,) * n, _same_padding(m.kernel_size, m.dilation)):
            if pad is not None and tuple(m.padding) != pad:
                out.append(("padding", pad, f"padding={pad[0] if len(set(pad)) == 1 else pad}"))
        if m.transposed:
            for op in range(0, max(max(m.stride), max(m.dilation))):
                if tuple(m.output_padding) != (op,) * n:
                    out.append(("output_padding", (op,) * n, f"output_padding={op}"))
        elif max(m.stride) > 1:
            out.append(("stride", (1,) * n, "stride=1"))
    elif isinstance(m, _POOLS):
        kernel = (m.kernel_size,) if isinstance(m.kernel_size, int) else tuple(m.kernel_size)
        same = _same_padding(kernel)
        now = m.padding if isinstance(m.padding, int) else max(m.padding)
        for p in {0, same[0] if same and len(set(same)) == 1 else 0} - {now}:
            out.append(("padding", p, f"padding={p}"))
        out.append(("ceil_mode", not m.ceil_mode, f"ceil_mode={not m.ceil_mode}"))
    return out


def upstream_candidates(module, args, kwargs, seed, mode, ctx) -> list:
    """``Candidate``s: an upstream layer argument that gives the failing layer exactly the size it
    was built for (see the module doc); nearest layer first."""
    from layerlab.engine.fix_search import Candidate
    from layerlab.probe.verify_fix import copy_model
    from layerlab.target.seeding import seeded

    want = _expected(ctx)
    layers = _upstream_layers(ctx) if want is not None else []
    if not layers:
        return []
    clone = copy_model(module, mode)
    if clone is None:
        return []
    try:
        target = clone.get_submodule(ctx.path) if ctx.path else None
    except AttributeError:
        return []
    if target is None:
        return []
    axis, size = want
    seen: List[Any] = []

    def stop(_module, inputs):
        x = next((t for t in inputs if isinstance(t, torch.Tensor)), None)
        seen.append(None if x is None or x.dim() <= (axis if axis >= 0 else -axis - 1) else int(x.shape[axis]))
        raise _Reached()

    handle = target.register_forward_pre_hook(stop)
    out, tries = [], 0
    try:
        for distance, path, _ in layers:
            try:
                layer = clone.get_submodule(path)
            except AttributeError:
                continue
            for name, value, code in _values(layer):
                if tries >= MAX_TRIES:
                    break
                tries += 1
                before = getattr(layer, name)
                setattr(layer, name, value)
                seen.clear()
                try:
                    with torch.no_grad(), seeded(seed, clone, [*args, *kwargs.values()]):
                        clone(*args, **kwargs)
                except _Reached:
                    pass
                except Exception:  # noqa: BLE001 - a value that breaks an earlier layer is no candidate
                    pass
                finally:
                    setattr(layer, name, before)
                if seen and seen[0] == size:
                    step = FixStep("set-attr", path, code, {"name": name, "value": value})
                    out.append(Candidate(step, f"`{path}` is meant to have {code}, which gives `{ctx.path}` the "
                                               f"{size} it was built for", distance=distance, keeps_layout=True))
    finally:
        handle.remove()
    return out

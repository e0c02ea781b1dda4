"""The ``histogram`` probe: the distribution of every layer's output values, as bin counts.

For each module call it takes the first floating tensor of the output (``out`` of an LSTM's
``(out, (h, c))``, the attention output of ``nn.MultiheadAttention``), and counts its finite
values with ``torch.histc`` into :data:`BINS` equal bins over the output's own ``min..max``. The
counts and the ``BINS + 1`` bin edges are the row's ``series`` (``counts``, ``edges``), so that
``layerlab.plot.histograms`` can draw them and the JSON keeps them whole. NaN and Inf are not
binned; their number is the ``nonfinite`` column.

Which layers: the *innermost* calls (calls that ran no other module inside them: ``Linear``,
``ReLU``, ``LayerNorm``, ``nn.MultiheadAttention``; a ``Sequential`` or a whole block is left
out, its output is its last layer's). When there are more than :data:`MAX_LAYERS`, the rows are
:data:`MAX_LAYERS` of them evenly spaced in execution order, the first and the last included;
the result's ``note`` says how many were left out.

Cost: one ``aminmax`` and one ``histc`` per module output (a tensor seen twice — a
``Sequential``'s output is its last child's — is counted once). Nothing is kept but the counts.
The probe only looks: it has no findings (a histogram is for reading, not a verdict).
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional, Tuple

from layerlab.probe.probes.base import Probe, ProbeResult, ProbeRow, ProbeRun

__all__ = ["HistogramProbe", "BINS", "MAX_LAYERS"]

#: bins per histogram (fixed, so that panels compare at a glance)
BINS = 32
#: at most this many layers get a histogram (evenly spaced in execution order)
MAX_LAYERS = 16


class HistogramProbe(Probe):
    """Bin counts of each layer's output values (see the module docstring for the rule)."""

    name = "histogram"
    title = "Output histograms"

    def __init__(self, bins: int = BINS, max_layers: int = MAX_LAYERS) -> None:
        if bins < 1 or max_layers < 1:
            raise ValueError(f"bins and max_layers must be at least 1, got {bins} and {max_layers}")
        self.bins = bins
        self.max_layers = max_layers
        # (path, call) -> (class name, histogram) in the order the calls finished
        self._seen: Dict[Tuple[str, int], Tuple[str, Optional[dict]]] = {}
        # a tensor already binned (weakly held: nothing is kept alive) -> its histogram
        self._done: Dict[int, Tuple[Any, int, Optional[dict]]] = {}

    def attach(self, run: ProbeRun) -> None:
        for path, module in run.named_modules:
            if path == "":  # the model's own output is its last layer's (or a loss): not a layer
                continue
            open_calls: List[int] = []  # a module may call itself: numbers are taken when calls start

            def pre(mod, args, path=path, stack=open_calls):
                stack.append(run.call_number(mod))

            def post(mod, args, output, path=path, stack=open_calls):
                call = stack.pop() if stack else 0
                self._seen[(path, call)] = (type(mod).__name__, self._histogram(output))

            run.forward_hook(module, pre, pre=True)
            run.forward_hook(module, post)

    def _histogram(self, output: Any) -> Optional[dict]:
        tensor = _first_float_tensor(output)
        if tensor is None:
            return None
        key = id(tensor)
        done = self._done.get(key)
        if done is not None and done[0]() is tensor and done[1] == tensor._version:
            return done[2]
        result = histogram(tensor, self.bins)
        self._done[key] = (weakref.ref(tensor), tensor._version, result)
        return result

    def result(self, report: Any) -> ProbeResult:
        self._done.clear()
        parents = {c.parent for c in report.calls if c.parent is not None}
        innermost = [c for c in report.calls if c.path and c.index not in parents
                     and self._seen.get((c.path, c.call), ("", None))[1] is not None]
        shown = _evenly_spaced(innermost, self.max_layers)
        rows = []
        for call in shown:
            class_name, h = self._seen[(call.path, call.call)]
            rows.append(ProbeRow(
                path=call.path, class_name=class_name, call=call.call,
                values={"min": h["min"], "max": h["max"], "peak": h["peak"], "peak_share": h["peak_share"],
                        "nonfinite": float(h["nonfinite"])},
                series={"counts": h["counts"], "edges": h["edges"]},
                flags=["no finite values"] if not h["counts"] else [],
            ))
        note = None
        if len(shown) < len(innermost):
            note = (f"{len(innermost)} innermost layer calls; {len(shown)} shown, evenly spaced in execution "
                    f"order (first and last included)")
        return ProbeResult(
            name=self.name, title=self.title,
            columns={"min": "min", "max": "max", "peak": "fullest bin", "peak_share": "its share",
                     "nonfinite": "NaN/Inf"},
            rows=rows,
            summary={"bins": self.bins, "layers": len(innermost), "shown": len(shown),
                     "rule": f"innermost module calls with a floating output, at most {self.max_layers} "
                             f"(evenly spaced in execution order)"},
            note=note,
        )


def histogram(tensor: Any, bins: int = BINS) -> dict:
    """``torch.histc`` of ``tensor``'s finite values over their own ``min..max``.

    Returns ``counts`` (``bins`` ints), ``edges`` (``bins + 1`` floats), ``min``, ``max``, the
    centre of the fullest bin (``peak``) and its share of the finite values (``peak_share``), and
    ``nonfinite`` (how many NaN/Inf were left out). A constant tensor gets the range ``v-1..v+1``
    (what ``torch.histc`` does itself); a tensor with no finite value gets empty ``counts``.
    """
    import torch

    with torch.no_grad():
        x = tensor.detach()
        if x.dtype not in (torch.float32, torch.float64):  # histc takes neither half nor bfloat16 everywhere
            x = x.float()
        x = x.reshape(-1)
        finite = torch.isfinite(x)
        n_finite = int(finite.sum())
        nonfinite = x.numel() - n_finite
        if n_finite < x.numel():
            x = x[finite]
        if n_finite == 0:
            return {"counts": [], "edges": [], "min": None, "max": None, "peak": None, "peak_share": None,
                    "nonfinite": nonfinite}
        lo, hi = (float(v) for v in torch.aminmax(x))
        low, high = (lo - 1.0, hi + 1.0) if lo == hi else (lo, hi)
        counts = torch.histc(x, bins=bins, min=low, max=high).to(torch.int64).tolist()
    edges = [low + (high - low) * i / bins for i in range(bins + 1)]
    fullest = max(range(bins), key=counts.__getitem__)
    return {"counts": counts, "edges": edges, "min": lo, "max": hi,
            "peak": (edges[fullest] + edges[fullest + 1]) / 2, "peak_share": counts[fullest] / n_finite,
            "nonfinite": nonfinite}


def _first_float_tensor(value: Any, depth: int = 0):
    """The first floating-point (not nested) tensor in a module's output, looking into
    tuples, lists and dicts (a Hugging Face ``ModelOutput`` is a dict)."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and not value.is_nested and not value.is_meta and value.numel() > 0:
            return value
        return None
    if depth > 4:
        return None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    for item in items:
        found = _first_float_tensor(item, depth + 1)
        if found is not None:
            return found
    return None


def _evenly_spaced(items: list, limit: int) -> list:
    """``items`` if there are at most ``limit``; else ``limit`` of them evenly spaced, first and last kept."""
    n = len(items)
    if n <= limit:
        return list(items)
    if limit == 1:
        return [items[0]]
    picks = sorted({round(i * (n - 1) / (limit - 1)) for i in range(limit)})
    return [items[i] for i in picks]

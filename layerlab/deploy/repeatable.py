"""When eager itself is not repeatable, "differs from eager" is the wrong reason.

Every export path is judged by comparing its outputs with eager's. A forward that reads Python state
which changes from call to call — a module-level counter (``global CALLS; CALLS += 1``),
``random.random()``, ``time.time()`` — gives two different outputs for one input. A traced, scripted
or exported program cannot follow it: the graph holds the value it saw once. Saying "the trace
differs from eager: max abs diff 8.85" then blames the path for what the layer does, and the number
is noise.

:func:`eager_drift` calls eager twice more on copies of the example, with torch's RNG seeded alike
before each call (so ``torch.rand`` in forward is repeatable and not flagged here), and compares.
If the outputs differ, :func:`mark_unrepeatable` rewrites every cell that compared outputs:

* the layer's tensors (buffers, parameters) did not change between the calls, so the drift comes
  from Python state: graph paths (trace, script, export, ONNX) FAIL — the artifact freezes that
  state — and ``compile`` WARNs (Dynamo re-runs Python guards on globals and may follow eager, but
  nothing can be compared);
* a buffer or parameter changed (a step counter kept in a tensor): graphs can carry such updates,
  so every compared cell is a WARN that says the outputs could not be compared.

Cells that raised keep their own reason.
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch

from layerlab.checks.report import Status

__all__ = ["eager_drift", "mark_unrepeatable"]

_GRAPH_PATHS = ("trace", "script", "export", "export_dynamic", "onnx")
_PROGRAM = {"trace": "traced module", "script": "scripted module", "export": "exported program",
            "export_dynamic": "exported program", "onnx": "ONNX model"}


def _state(module: torch.nn.Module) -> List[torch.Tensor]:
    return [t.detach().clone() for t in (*module.parameters(), *module.buffers())]


def eager_drift(ctx: Any) -> Optional[dict]:
    """``None`` when two eager calls on the example, each from ``ctx``'s seeded RNG state, agree;
    else ``{"problem", "tensor_state"}``: how they differ and whether the layer's own tensors
    changed between them."""
    outs, states = [], []
    for _ in range(2):
        with ctx.seeded(), torch.no_grad():  # the RNG state every compared run starts from
            pos, kw = ctx.split()
            outs.append(ctx.module_eval(*pos, **kw))
        states.append(_state(ctx.eager_module()))
    ok, comps, problem = ctx.compare(outs[1], outs[0])
    if ok:
        return None
    diffs = [c.get("max_abs_diff") for c in comps if c.get("max_abs_diff") is not None]
    problem = f"max abs diff {max(diffs):.3g}" if diffs else problem
    changed = any(a.shape != b.shape or not torch.equal(a.nan_to_num(), b.nan_to_num())
                  for a, b in zip(*states))
    return {"problem": problem, "tensor_state": changed}


def mark_unrepeatable(results: List[Any], drift: dict) -> None:
    """Rewrite the cells that compared outputs (see the module docstring)."""
    seen = f"eager is not repeatable: two calls on the same input differ ({drift['problem']})"
    for r in results:
        if r.matches_eager is None:  # never produced outputs: its own failure stands
            continue
        r.details["eager_not_repeatable"] = drift["problem"]
        r.matches_eager = None
        if drift["tensor_state"]:
            r.status = Status.WARN
            r.reason = f"{seen}; the layer updates its own buffers or parameters each call, so no outputs could be compared"
            r.hint = "check it with the state reset before each call (or frozen) to compare outputs"
        elif r.path in _GRAPH_PATHS:
            r.status = Status.FAIL
            r.reason = (f"{seen}; forward reads Python state that changes between calls (a global counter, "
                        f"random.random(), time): the {_PROGRAM.get(r.path, r.path)} froze the value it saw once")
            r.hint = ("keep changing state in a registered buffer updated with tensor ops, draw random numbers "
                      "with torch ops (torch.rand), or pass the value in as an input")
        else:
            r.status = Status.WARN
            r.reason = (f"{seen}; forward reads Python state that changes between calls, so no outputs could be "
                        f"compared (torch.compile re-checks Python values and may follow it)")
            r.hint = ("keep changing state in a registered buffer updated with tensor ops, or draw random numbers "
                      "with torch ops (torch.rand)")

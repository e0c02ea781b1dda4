"""An RNN's initial state (``h0``, ``(h0, c0)``): its shape, its layout, and where it came from.

:func:`hidden_state` checks the state against ``[num_layers·D, N, H]`` (the batch is dim 1 even with
``batch_first=True``): a state batched like batch-first data, a transposed ``h0``, a wrong size. A
state batched like the input's dim 0 says "batch-first data" only when it came from outside: one the
model built itself (``torch.zeros(1, x.size(0), H)``) repeats the model's own reading of the input,
and seq-first data with that ``h0`` looks the same — then both fixes are named and none is offered.

A state handed over from another module (seq2seq: the encoder's final state): when ``h0`` is a
module's output — the encoder GRU's ``h_n`` — and only its hidden size differs from
the decoder's, the state carries information: "build h0 as torch.zeros(…)" would make the model run
and throw the encoder away. The fix is to make the two hidden sizes agree (the decoder takes the
encoder's), or to map the state with a Linear between them.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from layerlab.engine.rule_registry import register_rule
from layerlab.probe import layout as Lay
from layerlab.probe.report import Diagnosis, FixStep


def state_from_module(ctx, m: nn.RNNBase, label: str, state, want: list, got: list) -> Optional[Diagnosis]:
    """``state`` (``h0``/``c0``) was made by a module call and differs from ``want`` only in its hidden size."""
    if len(want) != 3 or got[:2] != want[:2] or getattr(m, "proj_size", 0):
        return None
    call = ctx.producer(state)
    if call is None:
        return None
    name = type(m).__name__
    code = f"hidden_size={got[2]}"
    return Diagnosis(
        f"{name} expects {label} of shape [num_layers·D, N, H] = {want}, got {got}: {label} is the state of "
        f"{call.label} ({call.class_name}), whose hidden size is {got[2]}; {ctx.path or '(root)'} has hidden_size "
        f"{want[2]}",
        expected=want, got=got, cause="size",
        hint=f"make the hidden sizes agree: {code} on {ctx.path or 'the RNN'} (the layers reading its output then take "
             f"{got[2]} features), or map the state with nn.Linear({got[2]}, {want[2]}) between them; not "
             f"torch.zeros: that would drop what {call.label} passes on",
        fix=FixStep("set-arg", ctx.path, code, {"name": "hidden_size", "value": got[2]}),
        alternatives=[f"a bridge nn.Linear({got[2]}, {want[2]}) (and tanh) applied to {label}"],
        rule=f"{name}: {label} [num_layers·D, N, H] with H = hidden_size",
    )


@register_rule("rnn/initial-state", stage="module", on=(nn.RNNBase,), order=135)
def initial_state(ctx) -> Optional[Diagnosis]:
    """An RNN whose input fits (``input_size`` last, 2-D or 3-D) but whose initial state ``h0``/``(h0, c0)``
    does not: batched like batch-first data, transposed, a wrong size, or another module's state."""
    m, x = ctx.module, ctx.arg("input", 0)
    if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3) or x.shape[-1] != m.input_size:
        return None
    return hidden_state(ctx, m, x, ctx.arg("hx", 1))


def hidden_state(ctx, m: nn.RNNBase, x: torch.Tensor, hx) -> Optional[Diagnosis]:
    if hx is None:
        return None
    name = type(m).__name__
    d = 2 if m.bidirectional else 1
    lead = [m.num_layers * d]
    if x.dim() == 3:
        lead.append(x.shape[0] if m.batch_first else x.shape[1])
    h_size = m.proj_size if getattr(m, "proj_size", 0) else m.hidden_size
    wanted = [("h0", lead + [h_size])]
    states = [hx]
    if isinstance(m, nn.LSTM):
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            return Diagnosis(
                "LSTM expects its state as a tuple (h0, c0)", expected="(h0, c0)", got=type(hx).__name__,
                hint="pass hx=(h0, c0), or nothing for zeros", rule="LSTM: hx = (h0, c0)", cause="rank",
            )
        wanted.append(("c0", lead + [m.hidden_size]))
        states = list(hx)
    for (label, want), state in zip(wanted, states):
        if isinstance(state, torch.Tensor) and list(state.shape) != want:
            got = list(state.shape)
            if not m.batch_first and x.dim() == 3 and x.shape[0] != x.shape[1] and \
                    got == [want[0], x.shape[0], want[2]]:  # h0 batched as the input's dim 0: batch-first data
                built = _built_here(ctx, state)
                if built is not None:  # the model sized h0 from the input itself: no independent word on the batch
                    return _which_is_the_batch(ctx, m, x, label, want, got, built)
                return Diagnosis(
                    f"{name} has batch_first=False, so it reads the input {list(x.shape)} as (L, N, input_size) with "
                    f"N = {x.shape[1]}; but {label} {got} has N = {x.shape[0]}, the input's dim 0: the input is "
                    "(N, L, input_size)", expected=want, got=got, cause="layout",
                    hint="construct it with batch_first=True (the output is then (N, L, H) too)",
                    fix=FixStep("set-attr", ctx.path, "batch_first=True", {"name": "batch_first", "value": True}),
                    alternatives=[f"build {label} as torch.zeros({', '.join(map(str, want))}) — only if dim 0 "
                                  "of the input really is time"],
                    rule=f"{name}: input (L, N, input_size) when batch_first=False; {label} [num_layers·D, N, H]",
                )
            handed = state_from_module(ctx, m, label, state, want, got)
            if handed is not None:
                return handed
            swapped = len(want) == 3 and got == [want[1], want[0], want[2]]
            swap = " — it looks like batch-first; use h0.transpose(0, 1).contiguous()" if swapped else ""
            # a GRU's / RNN's h0 is one argument a pre-hook can transpose; an LSTM's sits in a tuple
            fix = Lay.permute_fix(ctx, ctx.key("hx", 1), [1, 0, 2], restore=False, var=label) \
                if swapped and isinstance(state, torch.Tensor) and state is hx else None
            return Diagnosis(
                f"{name} expects {label} of shape [num_layers·D, N, H] = {want}, got {got}"
                + (" (the batch is dim 1 even with batch_first=True)" if m.batch_first else ""),
                expected=want, got=got, cause="layout" if swapped else "size",
                hint=f"build {label} as torch.zeros({', '.join(map(str, want))}){swap}", fix=fix,
                rule=f"{name}: {label} [num_layers·D, N, H], D = {d}, H = {want[-1]}; batch_first never applies to states",
            )
    return None


#: Factories that build a state from sizes alone (``torch.zeros(1, x.size(0), H)``).
_FACTORIES = ("zeros", "ones", "empty", "randn", "rand", "full", "new_zeros", "new_ones", "new_empty", "new_full")


def _built_here(ctx, state) -> Optional[str]:
    """``"zeros at model.py:12"`` when ``state`` was built by a factory in the model's own code: its batch
    size is then the model's reading of the input (``x.size(0)``), not a second witness of it."""
    record = ctx.producer_op(state)
    if record is None or record.op not in _FACTORIES:
        return None
    return record.label


def _which_is_the_batch(ctx, m: nn.RNNBase, x: torch.Tensor, label: str, want: list, got: list, built: str) -> Diagnosis:
    """``h0`` is batched as the input's dim 0, but the model built it from the input's sizes: either the
    data is batch-first (``batch_first=True``) or it is seq-first and ``h0`` took the wrong dim. Both
    fixes run; they compute different things, so none is offered."""
    name, shape = type(m).__name__, list(x.shape)
    return Diagnosis(
        f"{name} has batch_first=False, so it reads the input {shape} as (L, N, input_size) with N = {shape[1]}; "
        f"{label} {got} has N = {shape[0]}, the input's dim 0, but it is built by {built} from the sizes the "
        "model itself read off the input: either the input is batch-first (N, L, input_size), or it is "
        f"seq-first and {label} took its length as the batch — layerlab cannot tell which",
        expected=want, got=got, cause="ambiguous",
        hint=f"if the input is (N, L, input_size), construct {ctx.path or 'the RNN'} with batch_first=True; if it is "
             f"(L, N, input_size), build {label} with the batch from dim 1: torch.zeros({', '.join(map(str, want))})",
        alternatives=["batch_first=True", f"{label} = torch.zeros({', '.join(map(str, want))})"],
        rule=f"{name}: input (L, N, input_size) when batch_first=False; {label} [num_layers·D, N, H]",
    )

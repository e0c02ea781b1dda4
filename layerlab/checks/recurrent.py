"""Check 8: the recurrent state contract, and that gradients flow through time.

torch's contract for ``nn.RNN``/``nn.LSTM``/``nn.GRU`` (and layers that say they follow it):

* ``h_n`` (and ``c_n``) have shape ``(num_layers·D, B, H_out)`` — *also with* ``batch_first=True``,
  which only changes the input and output, never the state (``D`` = 2 if bidirectional; ``H_out``
  = ``proj_size`` or ``hidden_size``; ``c_n`` always uses ``hidden_size``);
* the state has the input's dtype and device (a default ``h0`` built with ``torch.zeros(...)`` and
  no ``dtype=``/``device=`` breaks float64 and GPU inputs);
* omitting ``h0`` means zeros; passing ``h0`` in that shape is accepted;
* gradients reach ``h0``/``c0``, and ``h_n`` depends on every time step (a ``.detach()`` between
  steps, truncating backpropagation, shows up as time steps with zero gradient).

Cells (``LSTMCell`` and the like) are checked the same way with a ``(B, H)`` state and no time axis.

Which input dim is the batch: ``batch_dims`` for the input if the user gave it; else the batch size
of an ``h0`` the user passed; else the module's own ``batch_first``; else the batch size of the
state it returns (when it matches exactly one of the input's first two dims); else a submodule's
``batch_first``; else torch's default (sequence first). A wrapper around ``nn.LSTM`` need not copy
the ``batch_first`` attribute to be read right.

Time steps that get no gradient are not always a detached state: in a ReLU recurrence a step whose
whole output is exactly 0 (dead units) cuts every earlier step off. That is reported as a warning
naming the dead steps, not as a broken recurrence.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from layerlab.checks.case import (
    STATE_NAMES, Arg, Case, accepts, call, cast_args, flatten, float_leaves, generator, grad_inputs, module_copy,
    rand_like, randn_like, seq_first, short_dtype,
)
from layerlab.checks.compare import compare
from layerlab.checks.report import CheckResult, Status


def is_recurrent(case: Case) -> bool:
    m = case.module
    if "recurrent" in case.tags or isinstance(m, (nn.RNNBase, nn.RNNCellBase)):
        return True
    return isinstance(getattr(m, "hidden_size", None), int) and (accepts(m, "hx") or accepts(m, "h0"))


def _is_cell(m: nn.Module) -> bool:
    return isinstance(m, nn.RNNCellBase) or not hasattr(m, "num_layers")


def _is_lstm(m: nn.Module, out: Any, cell: bool) -> bool:
    if cell:
        return isinstance(out, tuple) and len(out) == 2
    return isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], tuple)


def _split(out: Any, cell: bool) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """``(output, h, c)`` from a recurrent layer's return value."""
    if cell:
        if isinstance(out, tuple):
            return None, out[0], out[1] if len(out) > 1 else None
        return None, out, None
    output, state = out[0], out[1]
    if isinstance(state, (tuple, list)):
        return output, state[0], state[1] if len(state) > 1 else None
    return output, state, None


def _user_state_batch(case: Case) -> Optional[int]:
    """The batch size of an ``h0``/``hx`` the user passed (its ``batch_dims`` entry, else dim 1 of a
    3-D state), or ``None``."""
    for a in case.args:
        if a.name not in STATE_NAMES:
            continue
        for path, t in flatten(a.value, a.name):
            d = case.batch_dims.get(path, case.batch_dims.get(a.name, 1 if t.dim() == 3 else None))
            if d is not None and -t.dim() <= d < t.dim():
                return int(t.shape[d])
    return None


def _returned_state_batch(m: nn.Module, args: List[Arg], cell: bool) -> Optional[int]:
    """Dim 1 of the ``h_n`` the module returns without ``h0`` (``None`` if it does not run or is not 3-D)."""
    try:
        with torch.no_grad():
            _, h, _ = _split(call(m, args), cell)
    except Exception:  # the contract check below reports the failure itself
        return None
    return int(h.shape[1]) if isinstance(h, Tensor) and h.dim() == 3 else None


def _batch_first(case: Case, m: nn.Module, args: List[Arg], x: Tensor, x_name: str, cell: bool,
                 unbatched: bool) -> Tuple[bool, str]:
    """``(batch_first, why)`` for a batched sequence input ``x`` (see the module doc for the order)."""
    if cell or unbatched:
        return False, "no time axis" if cell else "unbatched"
    if x_name in case.batch_dims and case.batch_dims[x_name] is not None:
        return case.batch_dims[x_name] % x.dim() == 0, f"batch_dims[{x_name!r}]"

    def by_size(b: Optional[int]) -> Optional[bool]:
        if b is None or (x.shape[0] == b) == (x.shape[1] == b):
            return None  # no evidence, or both dims have that size
        return x.shape[0] == b

    given = by_size(_user_state_batch(case))
    if given is not None:
        return given, "the batch size of the h0 passed"
    own = getattr(m, "batch_first", None)
    if isinstance(own, bool):
        return own, "its batch_first attribute"
    returned = by_size(_returned_state_batch(m, args, cell))
    if returned is not None:
        return returned, "the batch size of the h_n it returns"
    return not seq_first(m), "a submodule's batch_first" if any(
        isinstance(getattr(s, "batch_first", None), bool) for s in m.modules()) else "torch's default (T, B, E)"


def _with_state(args: List[Arg], module: nn.Module, state: Any) -> List[Arg]:
    rest = [a for a in args if a.name not in STATE_NAMES]
    name = "hx" if accepts(module, "hx") else "h0"
    if len(rest) == 1 and not rest[0].keyword:
        return rest + [Arg(name, state, False)]
    return rest + [Arg(name, state, True)]


def recurrent_state(case: Case, opts: Any = None) -> CheckResult:
    """h0/c0 shape, dtype and device contract; gradients reach h0 and every time step."""
    if not is_recurrent(case):
        return CheckResult("recurrent_state", Status.SKIP, "not a recurrent layer")
    m = module_copy(case.module, torch.float64, train=False)
    cell = _is_cell(m)
    args = [a for a in cast_args(case.args, torch.float64) if a.name not in STATE_NAMES]
    ins = grad_inputs(args)
    if not ins:
        return CheckResult("recurrent_state", Status.SKIP, "no floating sequence input")
    x_name, x = ins[0]
    L = int(getattr(m, "num_layers", 1))
    D = 2 if getattr(m, "bidirectional", False) else 1
    H = int(m.hidden_size)
    P = int(getattr(m, "proj_size", 0) or H)
    if x_name in case.batch_dims:
        unbatched = case.batch_dims[x_name] is None
    else:
        unbatched = x.dim() == (1 if cell else 2)
    bf, bf_why = _batch_first(case, m, args, x, x_name, cell, unbatched)
    B = None if unbatched else (x.shape[0] if (bf or cell) else x.shape[1])
    T = None if cell else x.shape[0 if (unbatched or not bf) else 1]
    lead = () if cell else (L * D,)
    bdim = () if unbatched else (B,)
    expect_h = lead + bdim + (P,)
    expect_c = lead + bdim + (H,)
    formula = "(B, H)" if cell else "(num_layers·D, B, H_out)"
    details: Dict[str, Any] = {"cell": cell, "num_layers": L, "D": D, "hidden_size": H, "batch_first": bf,
                               "batch_first_from": bf_why, "expected_h": list(expect_h), "dtype": "float64"}
    try:
        with torch.no_grad():
            out = call(m, args)
    except Exception as exc:
        text = str(exc).splitlines()[0] if str(exc) else ""
        # the cause decides the fix: no default state at all (None reached an op), or a default
        # state built in the wrong dtype/device (float32 zeros against float64 inputs)
        no_default = "NoneType" in text or "None" in text.split(":")[0]
        hint = ("give the state a default: when hx is None, start from torch.zeros(num_layers·D, B, hidden_size, "
                "dtype=x.dtype, device=x.device) as torch's RNNs do" if no_default else
                "build the default h0 with dtype=x.dtype and device=x.device "
                "(torch.zeros(..., dtype=x.dtype, device=x.device))")
        return CheckResult("recurrent_state", Status.FAIL,
                           f"fails without h0 (run in float64): {type(exc).__name__}: {text}",
                           where="h0", hint=hint, details=details)
    lstm = _is_lstm(m, out, cell)
    _, h, c = _split(out, cell)
    problems: List[Tuple[str, str, str]] = []
    for label, t, want in (("h_n", h, expect_h), ("c_n", c, expect_c if lstm else None)):
        if want is None:
            continue
        if t is None:
            problems.append((label, f"no {label} returned", f"return (output, {'(h_n, c_n)' if lstm else 'h_n'})"))
            continue
        details[f"{label}_shape"] = list(t.shape)
        if tuple(t.shape) != want:
            problems.append((label, f"{label} has shape {tuple(t.shape)}, torch's contract is {want} = {formula}"
                             + (" (also with batch_first=True)" if bf else ""),
                             "keep the state (num_layers·D, B, H) even with batch_first: only input and output are "
                             "batch-first"))
        if t.dtype != x.dtype or t.device != x.device:
            problems.append((label, f"{label} is {short_dtype(t.dtype)} on {t.device} for {short_dtype(x.dtype)} input "
                             f"on {x.device}", "create states with dtype=x.dtype, device=x.device"))
    if problems:
        return _fail(problems, details)
    zeros_h = torch.zeros(expect_h, dtype=x.dtype, device=x.device)
    state0 = (zeros_h, torch.zeros(expect_c, dtype=x.dtype, device=x.device)) if lstm else zeros_h
    try:
        with torch.no_grad():
            out_z = call(m, _with_state(args, m, state0))
    except Exception as exc:
        return _fail([("h0", f"rejects h0 of shape {expect_h} = {formula} (torch's contract"
                             f"{', also with batch_first=True' if bf else ''}): {type(exc).__name__}: "
                             f"{str(exc).splitlines()[0]}",
                       "accept h0 as (num_layers·D, B, H) whatever batch_first says")], details)
    same = [compare(a, b, f"zero h0: {p}", dtype=torch.float64) for (p, a), (_, b) in
            zip(float_leaves(out_z), float_leaves(out))]
    if not all(c.ok for c in same):
        bad = next(c for c in same if not c.ok)
        return _fail([("h0", f"passing h0 = zeros differs from passing no h0 ({bad.what}: {bad.describe()})",
                       "the default initial state must be zeros")], details)
    return _gradients(case, m, args, x, ins[0][0], state0, lstm, cell, T, bf, unbatched, details)


def _gradients(case, m, args, x, x_name, state0, lstm, cell, T, bf, unbatched, details) -> CheckResult:
    gen = generator(case.seed, 8)
    xg = x.detach().clone().requires_grad_(True)
    h0 = randn_like(state0[0] if lstm else state0, gen).requires_grad_(True)
    c0 = randn_like(state0[1], gen).requires_grad_(True) if lstm else None
    new_args = [Arg(a.name, xg if a.value is x else a.value, a.keyword) for a in args]
    out = call(m, _with_state(new_args, m, (h0, c0) if lstm else h0))
    _, h, c = _split(out, cell)
    details["h_n_requires_grad"] = bool(h.requires_grad)
    if not h.requires_grad:
        return _fail([("h_n", "h_n does not require grad although the input does",
                       "the final state is cut from the graph (.detach() / torch.no_grad() / .data)")], details)
    loss = sum((y * rand_like(y, gen)).sum()
               for _, y in float_leaves(out) if y.requires_grad)
    targets = [h0] + ([c0] if lstm else [])
    grads = torch.autograd.grad(loss, targets, allow_unused=True, retain_graph=True)
    moves = _mover(m, args, x, (h0.detach(), c0.detach()) if lstm else h0.detach(), lstm, cell, gen)
    dead_relu = _uses_relu(m) and _exact_zeros(out, cell)
    problems, explained = [], []  # explained: cut off by dead ReLU units, not by the code
    for label, g in zip(("h0", "c0"), grads):
        if g is None or not bool(torch.isfinite(g).all()) or bool((g == 0).all()):
            state = "no" if g is None else ("a non-finite" if not bool(torch.isfinite(g).all()) else "an all-zero")
            if state != "an all-zero":
                problems.append((label, f"{state} gradient reaches {label}",
                                 f"{label} must enter the first step's computation (not be replaced or detached)"))
            else:
                _classify(problems, explained, label, f"{label}", moves(which=label), dead_relu)
    if not cell and T is not None:
        gx, = torch.autograd.grad((h * rand_like(h, gen)).sum(), [xg],
                                  allow_unused=True)
        tdim = 0 if (unbatched or not bf) else 1
        dead = list(range(T)) if gx is None else [t for t in range(T) if bool((gx.select(tdim, t) == 0).all())]
        details["time_steps_without_gradient"] = dead
        if dead:
            _classify(problems, explained, f"{x_name} time step {dead[0]}",
                      f"time step(s) {_steps(dead)} of {T}", moves(steps=(tdim, dead)), dead_relu)
    if problems:
        return _fail(problems, details)
    if explained:
        return CheckResult(
            "recurrent_state", Status.WARN,
            f"no gradient reaches {' and '.join(w for w, _ in explained)}, and h_n does not change when they change: "
            "dead ReLU units (outputs exactly 0), not a cut recurrence",
            where=explained[0][1], details=details,
            hint="dead ReLU units: a large negative bias or pre-activation; re-initialise (smaller weights, bias 0), "
                 "normalise the inputs, or use nonlinearity='tanh'")
    steps = "" if cell else f" and all {T} time steps"
    return CheckResult("recurrent_state", Status.PASS,
                       f"state {tuple(details['expected_h'])} as torch's contract; zeros default; gradients reach h0"
                       f"{'/c0' if lstm else ''}{steps}", details=details)


def _steps(steps: List[int]) -> str:
    return f"{steps[:8]}{' …' if len(steps) > 8 else ''}"


def _uses_relu(m: nn.Module) -> bool:
    return any(getattr(s, "nonlinearity", None) == "relu" or isinstance(s, nn.ReLU) for s in m.modules())


def _exact_zeros(out: Any, cell: bool) -> bool:
    """Are some outputs (the sequence; a cell's new state) exactly 0, as dead ReLU units leave them?"""
    y = _split(out, cell)[1 if cell else 0]
    return isinstance(y, Tensor) and bool((y == 0).any())


def _mover(m, args, x, state, lstm, cell, gen):
    """``moves(which="h0"|"c0", steps=(tdim, [t…]))``: does ``h_n``/``c_n`` change when ``h0``/``c0`` or the input at
    some time steps is nudged (float64, relative 1e-6)? A gradient of zero where the output moves is
    a cut graph; where it does not, the values themselves are flat (dead units, ignored steps)."""

    def final(xv, st) -> Tensor:
        new = [Arg(a.name, xv if a.value is x else a.value, a.keyword) for a in args]
        with torch.no_grad():
            _, h, c = _split(call(m, _with_state(new, m, st)), cell)
        return torch.cat([t.reshape(-1) for t in (h, c) if isinstance(t, Tensor)])

    base = final(x, state)

    def nudge(t: Tensor) -> Tensor:
        return t + 1e-6 * (1 + float(t.abs().max())) * randn_like(t, gen)

    def moves(which: Optional[str] = None, steps: Optional[Tuple[int, List[int]]] = None) -> bool:
        xv, st = x, state
        if which == "h0":
            st = (nudge(state[0]), state[1]) if lstm else nudge(state)
        elif which == "c0":
            st = (state[0], nudge(state[1]))
        if steps is not None:
            tdim, ts = steps
            xv = x.clone()
            for t in ts:
                xv.select(tdim, t).copy_(nudge(x.select(tdim, t)))
        return bool(((final(xv, st) - base).abs() > 1e-10 * (1 + float(base.abs().max()))).any())

    return moves


def _classify(problems: list, explained: list, where: str, what: str, moved: bool, dead_relu: bool) -> None:
    """File one "no gradient reaches ``what``" finding as a cut graph, an ignored input, or dead units."""
    if moved:
        problems.append((where, f"no gradient reaches {what}, yet h_n changes when they change: the gradient is cut",
                         "the hidden state is detached between steps (h = h.detach(), .data, torch.no_grad())"))
    elif dead_relu:
        explained.append((what, where))
    else:
        problems.append((where, f"no gradient reaches {what}, and h_n does not change when they change: ignored",
                         "every step (and h0) must enter the recurrence: steps skipped, or the state replaced"))


def _fail(problems, details) -> CheckResult:
    details["problems"] = [{"where": w, "problem": p, "hint": h} for w, p, h in problems]
    where, _, hint = problems[0]
    return CheckResult("recurrent_state", Status.FAIL, "; ".join(p for _, p, _ in problems), where=where, hint=hint,
                       details=details)

"""Is a parameter gradient's error rounding at a kink (a ReLU input near 0), or lost precision?

A ReLU sends its gradient through where its input is positive and nowhere else. An input that
float32 makes +3.0e-4 and float16 −3.7e-5 (its rounding moved it across 0) switches that unit's
gradient path off in the half run: in a small model one such element moves a parameter gradient
by several percent, while every forward output stays within a few eps. That is rounding at a kink,
not a backward that loses precision, and the fix for the latter (run the backward in float32) would
not change it.

So, when a gradient error has no forward error to explain it, it is checked on a copy:

1. the half run again under :class:`SidesSeen`, a :class:`~torch.overrides.TorchFunctionMode`
   that notes for each call of a kink op which side of the kink every input element is on (a bool
   or a one-byte region per element, int64 indices per max-pool output; at most
   :data:`MAX_ELEMENTS` elements in all, else nothing is verified);
2. float32 under :class:`SidesForced`, which replays those sides call by call (``relu(x)`` becomes
   ``torch.where(half_side, x, 0)``: each element takes the half run's branch, and the gradient
   its formula), with the float32 run's seed, inputs and loss projection
   (:func:`~layerlab.mixed.runs.run`'s ``mode``).

If the half run's gradients match this "float32 on the half run's branches" within the gradient
bar, the flipped elements explain the error (:class:`Verdict`). The kink ops:

===========================================================  ===================================
op                                                           side (the branch it takes)
===========================================================  ===================================
relu, relu_, leaky_relu(_), ``Tensor.relu(_)``               ``x > 0``
threshold(_)                                                 ``x > threshold``
hardtanh(_), relu6                                           below / inside ``(lo, hi)`` / above
clamp, clip (and ``_``, Tensor methods; number or tensor     below / inside ``[lo, hi]`` / above
bounds)
max_pool1d/2d/3d                                             the element each window picks
===========================================================  ===================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

#: no verification when the kink ops' inputs hold more elements than this (their sides are kept)
MAX_ELEMENTS = 64 * 2 ** 20
#: per call, the half values of this many elements nearest the kink are kept (to show one flip)
NEAREST = 16

_RELU = {F.relu: False, F.relu_: True, torch.relu: False, torch.relu_: True,
         torch.Tensor.relu: False, torch.Tensor.relu_: True}
_LEAKY = {F.leaky_relu: False, F.leaky_relu_: True}
_THRESHOLD = {F.threshold: False, F.threshold_: True}
_HARDTANH = {F.hardtanh: False, F.hardtanh_: True, F.relu6: False}
_CLAMP = {torch.clamp: False, torch.clip: False, torch.clamp_: True, torch.clip_: True,
          torch.Tensor.clamp: False, torch.Tensor.clip: False, torch.Tensor.clamp_: True,
          torch.Tensor.clip_: True}
_POOL = {F.max_pool1d: 1, F.max_pool2d: 2, F.max_pool3d: 3}
_POOL_ARGS = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")


@dataclass
class Kink:
    """One kink op's call: what it is, where its kinks are, and whether it writes into its input."""

    family: str  # what the message calls its inputs: "ReLU", "LeakyReLU", "clamp", "max-pool" …
    x: torch.Tensor
    lo: Any = None  # the kink (relu: 0); hardtanh/clamp: the lower bound (None: none)
    hi: Any = None  # hardtanh/clamp: the upper bound
    fill: Optional[Callable[[torch.Tensor], Any]] = None  # one kink: the value off the x branch (relu: 0)
    in_place: bool = False
    strict: bool = True  # hardtanh's gradient is 0 at a bound, clamp's is 1


def _arg(args: tuple, kwargs: dict, i: int, name: str, default: Any) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def kink_of(func: Any, args: tuple, kwargs: dict) -> Optional[Kink]:
    """The kink op this call is (``None``: not one, or not on a floating tensor)."""
    x = args[0] if args else kwargs.get("input")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or func in _POOL:
        return None
    if func in _RELU:
        return Kink("ReLU", x, lo=0.0, fill=lambda x: 0.0,
                    in_place=_RELU[func] or bool(_arg(args, kwargs, 1, "inplace", False)))
    if func in _LEAKY:
        slope = _arg(args, kwargs, 1, "negative_slope", 0.01)
        return Kink("LeakyReLU", x, lo=0.0, fill=lambda x: x * slope,
                    in_place=_LEAKY[func] or bool(_arg(args, kwargs, 2, "inplace", False)))
    if func in _THRESHOLD:
        value = _arg(args, kwargs, 2, "value", 0.0)
        return Kink("threshold", x, lo=_arg(args, kwargs, 1, "threshold", 0.0), fill=lambda x: value,
                    in_place=_THRESHOLD[func] or bool(_arg(args, kwargs, 3, "inplace", False)))
    if func is F.relu6:
        return Kink("ReLU6", x, lo=0.0, hi=6.0, in_place=bool(_arg(args, kwargs, 1, "inplace", False)))
    if func in _HARDTANH:
        return Kink("Hardtanh", x, lo=_arg(args, kwargs, 1, "min_val", -1.0), hi=_arg(args, kwargs, 2, "max_val", 1.0),
                    in_place=_HARDTANH[func] or bool(_arg(args, kwargs, 3, "inplace", False)))
    if func in _CLAMP:
        lo, hi = _arg(args, kwargs, 1, "min", None), _arg(args, kwargs, 2, "max", None)
        if lo is None and hi is None:
            return None
        return Kink("clamp", x, lo=lo, hi=hi, in_place=_CLAMP[func], strict=False)
    return None


def _two_sided(k: Kink) -> bool:
    return k.fill is None


def side(k: Kink) -> torch.Tensor:
    """Which branch each element of the input takes: bool (above the kink) for one kink, int8
    0 below / 1 inside / 2 above for two, with torch's own convention at a bound."""
    x = k.x.detach()
    if not _two_sided(k):
        return x > k.lo
    lo, hi = (b.detach() if isinstance(b, torch.Tensor) else b for b in (k.lo, k.hi))
    none = torch.zeros_like(x, dtype=torch.bool)
    below = none if lo is None else x <= lo if k.strict else x < lo
    above = none if hi is None else x >= hi if k.strict else x > hi
    return torch.ones_like(x, dtype=torch.int8) - below.to(torch.int8) + above.to(torch.int8)


def distance(k: Kink) -> torch.Tensor:
    """Each element's distance to the nearest kink (float32)."""
    x = k.x.detach().float()
    bounds = [b for b in (k.lo, k.hi) if b is not None]
    found = [(x - (b.detach().float() if isinstance(b, torch.Tensor) else b)).abs() for b in bounds]
    return found[0] if len(found) == 1 else torch.minimum(found[0], found[1])


def forced(k: Kink, sides: torch.Tensor) -> torch.Tensor:
    """The op's output with each element on the branch ``sides`` says (gradients follow it)."""
    x = k.x
    if not _two_sided(k):
        return torch.where(sides, x, k.fill(x))
    if k.lo is None:
        off = k.hi
    elif k.hi is None:
        off = k.lo
    else:
        off = torch.where(sides == 0, torch.as_tensor(k.lo, dtype=x.dtype), torch.as_tensor(k.hi, dtype=x.dtype))
    return torch.where(sides == 1, x, off)


def _pool(func: Any, args: tuple, kwargs: dict) -> Tuple[dict, bool]:
    """A max-pool call's arguments by name, ``return_indices`` taken out (the caller's wish)."""
    merged = dict(zip(_POOL_ARGS, args))
    merged.update(kwargs)
    return merged, bool(merged.pop("return_indices", False))


@dataclass
class Seen:
    """One kink call of the half run: its op family, input shape, sides, the half values nearest
    the kink (flat index → value)."""

    family: str
    shape: tuple
    sides: torch.Tensor
    nearest: Dict[int, float] = field(default_factory=dict)


class SidesSeen(TorchFunctionMode):
    """Notes the sides of every kink op's input, in call order (the half run)."""

    def __init__(self, limit: int = MAX_ELEMENTS) -> None:
        super().__init__()
        self.calls: List[Seen] = []
        self.elements = 0
        self.limit = limit

    @property
    def too_many(self) -> bool:
        return self.elements > self.limit

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _POOL and isinstance(args[0] if args else kwargs.get("input"), torch.Tensor):
            merged, wanted = _pool(func, args, kwargs)
            out, idx = func(**merged, return_indices=True)
            self.elements += idx.numel()
            if not self.too_many:
                self.calls.append(Seen("max-pool", tuple(merged["input"].shape), idx.detach()))
            return (out, idx) if wanted else out
        k = kink_of(func, args, kwargs)
        if k is not None:
            self.elements += k.x.numel()
            if not self.too_many:  # before the call: an in-place op overwrites its input
                seen = Seen(k.family, tuple(k.x.shape), side(k))
                if k.x.numel():
                    d = distance(k).flatten()
                    near = torch.topk(d, min(NEAREST, d.numel()), largest=False).indices
                    seen.nearest = dict(zip(near.tolist(), k.x.detach().flatten()[near].float().tolist()))
                self.calls.append(seen)
        return func(*args, **kwargs)


@dataclass
class Flips:
    """Per op family: ``flipped`` of ``total`` input elements (max-pool: windows) took another
    branch than float32's; ``example``: one of them, (float32 value, half value or None)."""

    family: str
    flipped: int = 0
    total: int = 0
    example: Optional[Tuple[float, Optional[float]]] = None


class SidesForced(TorchFunctionMode):
    """Replays :class:`SidesSeen`'s sides in a float32 run and counts the elements where float32's
    own side differs. ``failed`` says why the replay does not fit (another op order or shape)."""

    def __init__(self, calls: Sequence[Seen]) -> None:
        super().__init__()
        self.calls = list(calls)
        self.next = 0
        self.flips: Dict[str, Flips] = {}
        self.failed: Optional[str] = None

    def _take(self, family: str, shape: tuple) -> Optional[Seen]:
        if self.failed is not None:
            return None
        if self.next >= len(self.calls):
            self.failed = f"float32 ran more kink ops than the half run ({len(self.calls)})"
            return None
        seen = self.calls[self.next]
        self.next += 1
        if seen.family != family or seen.shape != shape:
            self.failed = f"kink op {self.next} is {family}{list(shape)} here, {seen.family}{list(seen.shape)} there"
            return None
        return seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _POOL and isinstance(args[0] if args else kwargs.get("input"), torch.Tensor):
            merged, wanted = _pool(func, args, kwargs)
            seen = self._take("max-pool", tuple(merged["input"].shape))
            out, idx = func(**merged, return_indices=True)
            if seen is None:
                return (out, idx) if wanted else out
            count = self.flips.setdefault("max-pool", Flips("max-pool"))
            count.total += idx.numel()
            count.flipped += int((idx != seen.sides).sum())
            dims = _POOL[func]
            x = merged["input"]
            out = x.flatten(-dims).gather(-1, seen.sides.flatten(-dims)).view(seen.sides.shape)
            return (out, seen.sides) if wanted else out
        k = kink_of(func, args, kwargs)
        if k is None:
            return func(*args, **kwargs)
        seen = self._take(k.family, tuple(k.x.shape))
        if seen is None:
            return func(*args, **kwargs)
        mine = side(k)
        count = self.flips.setdefault(k.family, Flips(k.family))
        count.total += mine.numel()
        other = mine != seen.sides
        n = int(other.sum())
        count.flipped += n
        if n and count.example is None:
            flat = other.flatten().nonzero().flatten()
            known = [i for i in flat.tolist() if i in seen.nearest]
            i = known[0] if known else int(flat[0])
            count.example = (float(k.x.detach().flatten()[i]), seen.nearest.get(i))
        out = forced(k, seen.sides)
        if k.in_place:
            return k.x.copy_(out)
        return out


@dataclass
class Verdict:
    """What the check found: per warned parameter, the half run's gradient error against float32
    on the half run's branches (``errors``); the flips; ``reason`` when it could not check."""

    errors: Dict[str, float] = field(default_factory=dict)
    flips: List[Flips] = field(default_factory=list)
    reason: Optional[str] = None

    @property
    def flipped(self) -> int:
        return sum(f.flipped for f in self.flips)

    def explains(self, bar: float) -> bool:
        """Flips were seen and, on the half run's branches, float32's gradients are within ``bar``."""
        return self.reason is None and self.flipped > 0 and bool(self.errors) and max(self.errors.values()) <= bar


def _relative(g: torch.Tensor, ref: torch.Tensor) -> float:
    g, ref = g.detach().double(), ref.detach().double()
    norm = float(torch.linalg.vector_norm(ref))
    if not norm:  # float32 on the half run's branches gives 0: any other gradient is off by all of it
        return float("inf") if bool(g.any()) else 0.0
    return float(torch.linalg.vector_norm(g - ref)) / norm


def verify(module: torch.nn.Module, args: Sequence[Any], ref: Any, half: Any, names: Sequence[str], seed: int,
           restore: Callable[[], None] = lambda: None) -> Verdict:
    """Re-run ``half``'s setting noting the kink sides, then float32 on those sides; ``names``: the
    parameters whose gradient error is to be explained. ``restore`` puts the inputs back after a run."""
    from layerlab.mixed.runs import FLOAT32, run

    seen = SidesSeen()
    again = run(module, args, half.setting, seed=seed, reference=ref, mode=seen)
    restore()
    if again.raised is not None:
        return Verdict(reason=f"the half run raised when run again: {again.raised}")
    if seen.too_many:
        return Verdict(reason=f"kink inputs hold {seen.elements} elements (> {MAX_ELEMENTS}): not checked")
    if not seen.calls:
        return Verdict(reason="no kink op (ReLU, clamp, max-pool …) ran")
    for n in names:  # the run again must be the run that was warned about
        g, h = again.grads.get(n), half.grads.get(n)
        if g is None or h is None or not torch.equal(g, h):
            return Verdict(reason=f"the half run's gradient of {n} is not the same when run again")
    replay = SidesForced(seen.calls)
    on_branches = run(module, args, FLOAT32, seed=seed, reference=ref, mode=replay)
    restore()
    if on_branches.raised is not None:
        return Verdict(reason=f"float32 on the half run's branches raised: {on_branches.raised}")
    if replay.failed is None and replay.next != len(seen.calls):
        replay.failed = f"float32 ran {replay.next} kink ops, the half run {len(seen.calls)}"
    if replay.failed is not None:
        return Verdict(reason=replay.failed)
    errors = {}
    for n in names:
        g, f = half.grads.get(n), on_branches.grads.get(n)
        if g is None or f is None:
            return Verdict(reason=f"no gradient of {n} on the half run's branches")
        errors[n] = _relative(g, f)
    return Verdict(errors=errors, flips=list(replay.flips.values()))

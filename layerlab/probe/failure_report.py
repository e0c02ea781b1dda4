"""The failure side of an inspect report: where the forward or backward raised, why, and the fix.

Plain dataclasses, no formatting (see cli/render_inspect); field names are the JSON keys. Split from
:mod:`layerlab.probe.report`, which re-exports every name here.

    Failure       the call (or op) that raised, with its inputs, where they came from (Origin, OpRecord)
    Diagnosis     the cause and the suggested fix (FixStep), and the fix re-run on a copy (Verification)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional

if TYPE_CHECKING:  # (report.py imports this module: the annotation is a string here)
    from layerlab.probe.report import TensorInfo

__all__ = ["FixStep", "VerifiedStep", "Verification", "Diagnosis", "Operand", "OpRecord", "Origin", "Failure"]


@dataclass
class FixStep:
    """One mechanical change that layerlab can apply to a copy of the model and re-run.

    ``kind`` and ``params`` say what to do (see :mod:`layerlab.probe.fixes`); ``where`` is the
    module path (or ``file:line`` for an op); ``code`` is what to write, in the user's terms.

    kinds: ``permute-input`` (``dims``, ``restore``: permute the module's input, and back after),
    ``reshape-input`` (``op``: flatten/unsqueeze, ``repeat_interleave`` of a per-batch mask over the
    heads, ``first``: the first element of a tuple the module was given), ``cast-input``
    (``to``: long/bool/eq0, ``crop:L,S`` / ``narrow:dim:n`` to cut a mask or a sequence),
    ``set-arg`` (rebuild the module with ``name=value``, and ``also``: more arguments changed with
    it), ``set-attr`` (``name=value`` on the module, dotted names allowed), ``call-kwarg`` (add
    ``name=value`` to the module's calls), ``move-input`` (pass the argument ``arg`` as ``to_name``),
    ``replace-op`` (at ``site``: another op or argument for that one call).
    """

    kind: str
    where: str
    code: str
    params: Dict[str, Any] = field(default_factory=dict)


@dataclass
class VerifiedStep:
    """A failure met while verifying a fix, and the fix applied for it."""

    where: str
    message: str
    fix: Optional[FixStep] = None


@dataclass
class Verification:
    """What happened when the fix was applied to a copy of the model and the forward re-run.

    ``status``: ``runs`` (the model ran with ``steps`` applied and passed every oracle in
    ``checks``: backward, batch independence, other sizes, causality; ``outputs`` are its output
    shapes), ``implausible`` (it runs, but the oracle ``failed_check`` failed: ``note`` says how, e.g.
    "sample 0's output then depends on the other samples"), ``still-fails`` (the last entry of
    ``then`` failed and no rule had a fix for it, or the fix changed nothing), ``not-verified``
    (``note`` says why: no copy could be made, the time cap, too many steps).
    """

    status: str
    steps: List[FixStep] = field(default_factory=list)
    then: List[VerifiedStep] = field(default_factory=list)
    outputs: List[List[int]] = field(default_factory=list)
    note: Optional[str] = None
    checks: List[str] = field(default_factory=list)
    failed_check: Optional[str] = None


@dataclass
class Diagnosis:
    """Why a layer or op raised: the cause, the rule, expected versus got, and the fix.

    ``cause`` is a short code (``layout``, ``size``, ``rank``, ``non-contiguous``,
    ``element-count``, ``cat-dim``, ``broadcast``, ``inner-dim``, ``mask-dtype``, ``mask-shape``,
    ``index-range``, ``dtype``, ``device``, ``ambiguous`` …). ``fix`` is the mechanical change
    behind ``hint`` when there is one; ``alternatives`` are other fixes, in order, each with its
    caveat; ``verified`` says what re-running with ``fix`` on a copy gave. ``rule`` is the torch rule
    that was broken, in words; ``rule_id`` the id of the layerlab rule that recognised the failure
    (:mod:`layerlab.engine.rule_registry`; grep the source for it), ``severity`` that rule's.
    """

    message: str
    expected: Any = None
    got: Any = None
    hint: Optional[str] = None
    rule: Optional[str] = None
    cause: Optional[str] = None
    fix: Optional[FixStep] = None
    alternatives: List[str] = field(default_factory=list)
    verified: Optional[Verification] = None
    rule_id: Optional[str] = None
    severity: str = "error"


@dataclass
class Operand:
    """One tensor argument of a recorded op: where it sits, its shape and dtype, and what made it
    (``from_call``: the module call whose output it is; ``from_op``: the op that returned it)."""

    name: str
    shape: List[int]
    dtype: str
    from_call: Optional[int] = None
    from_op: Optional[int] = None


@dataclass
class OpRecord:
    """One torch function or tensor method called from the user's code during the forward.

    ``call`` is the innermost module call running at the time (the op's row nests under it);
    ``after_call`` the number of module calls started before it (its place among the rows).
    ``source`` is the user's ``file:line`` (the first frame outside torch and layerlab) and
    ``code`` that line's text; ``receiver`` the expression a tensor method was called on
    (``x`` in ``x.view(…)``, read from that line), ``None`` for functions. ``outputs`` are the output shapes; ``contiguous`` whether each
    output is contiguous. ``status`` is ``ok`` or ``raised``.
    """

    index: int
    op: str
    call: Optional[int]
    after_call: int
    inputs: List[Operand] = field(default_factory=list)
    args: Dict[str, Any] = field(default_factory=dict)
    outputs: List[List[int]] = field(default_factory=list)
    out_dtypes: List[str] = field(default_factory=list)
    contiguous: List[bool] = field(default_factory=list)
    source: Optional[str] = None
    code: Optional[str] = None
    status: str = "ok"
    receiver: Optional[str] = None

    @property
    def label(self) -> str:
        return f"{self.op} at {self.source}" if self.source else self.op


@dataclass
class Origin:
    """Where one input of the failing call came from, newest step first.

    ``steps`` are readable (``x.transpose(1, 2) at model.py:41``, ``the output of emb (Embedding)``,
    ``a model input``); ``text`` joins them into one sentence.
    """

    input: str
    shape: List[int]
    steps: List[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        if not self.steps:
            return f"{self.input} {self.shape} is a model input"
        steps = list(self.steps)
        tail = ", applied to a model input" if steps[-1] == "a model input" and len(steps) > 1 else ""
        if tail:
            steps.pop()
        return f"{self.input} {self.shape} came from " + ", after ".join(steps) + tail


@dataclass
class Failure:
    """The exception that stopped the forward or backward pass, and where it happened.

    ``call`` is the index of the call that started and never finished (the innermost one);
    ``chain`` lists the unfinished calls' paths from the outermost in.
    """

    phase: str
    exception: str
    message: str
    call: Optional[int] = None
    path: Optional[str] = None
    class_name: Optional[str] = None
    inputs: List[TensorInfo] = field(default_factory=list)
    chain: List[str] = field(default_factory=list)
    diagnosis: Optional[Diagnosis] = None
    op: Optional[OpRecord] = None
    origins: List[Origin] = field(default_factory=list)

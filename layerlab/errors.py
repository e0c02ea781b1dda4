"""One exception family for everything layerlab reports to a user.

Every error carries structured fields (``where``, ``expected``, ``got``, ``hint``) so that the
CLI can render it as one readable message and ``--json`` can carry the same facts. The
``exit_code`` follows the project convention: 2 for bad usage or input, 1 for "a check failed /
torch would raise", 130 for Ctrl-C (:class:`Interrupted`) and 141 when the reader of stdout went
away (:data:`EXIT_BROKEN_PIPE`).

This module never imports torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional


#: Exit code when stdout was closed by its reader (``layerlab … | head``): 128 + SIGPIPE, what a
#: shell reports for a Unix tool that SIGPIPE ended, so ``set -o pipefail`` scripts see it the same way.
EXIT_BROKEN_PIPE = 141


def debug_enabled() -> bool:
    """``LAYERLAB_DEBUG=1``: show tracebacks for known errors too, and let an error inside one
    check, export path or layer of ``--all`` propagate instead of becoming a failed cell."""
    return os.environ.get("LAYERLAB_DEBUG", "") not in ("", "0", "false", "no")


class LayerlabError(Exception):
    """Base class: a problem layerlab can explain to the user without a traceback.

    Args:
        message: what went wrong, in one sentence.
        where: the location: ``file:line``, a module path (``encoder.layers.3.linear1``),
            an option name (``--padding``) or a dimension (``H``).
        expected: what was expected (free text or a value).
        got: what was found instead.
        hint: how to fix it.
    """

    exit_code = 2
    kind = "error"

    def __init__(
        self,
        message: str,
        *,
        where: Optional[str] = None,
        expected: Any = None,
        got: Any = None,
        hint: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.where = where
        self.expected = expected
        self.got = got
        self.hint = hint

    def to_dict(self) -> dict:
        """The JSON form of the error (stable keys; ``None`` fields are kept as ``null``)."""
        return {
            "error": type(self).__name__,
            "kind": self.kind,
            "message": self.message,
            "where": self.where,
            "expected": _jsonable(self.expected),
            "got": _jsonable(self.got),
            "hint": self.hint,
            "exit_code": self.exit_code,
        }


class UsageError(LayerlabError):
    """A malformed command-line option or argument (exit 2)."""

    kind = "usage"


class SpecError(LayerlabError):
    """A YAML spec that cannot be loaded, validated or built (exit 2)."""

    kind = "spec"


class LayerInputError(LayerlabError, ValueError):
    """A bad constructor argument or forward input of a layerlab reference layer (exit 2).

    Also a :class:`ValueError`, so plain ``except ValueError`` code keeps working.
    """

    kind = "layer-input"


class CheckFailed(LayerlabError):
    """A verification check failed, or a layer raised while being run (exit 1)."""

    exit_code = 1
    kind = "check"


class Interrupted(LayerlabError):
    """Ctrl-C (SIGINT) during a command (exit 130, 128 + SIGINT)."""

    exit_code = 130
    kind = "interrupted"


class TorchWouldRaise(CheckFailed):
    """The arithmetic says torch rejects this configuration (exit 1).

    Besides the common fields it records the exception torch raises (class name and the first
    line of its message), the rule in ../shared/shape_rules.md it comes from, and suggestions
    of nearby valid settings.
    """

    kind = "torch-would-raise"

    def __init__(
        self,
        message: str,
        *,
        torch_exception: str,
        torch_message: str,
        rule: Optional[str] = None,
        suggestions: Optional[list] = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.torch_exception = torch_exception
        self.torch_message = torch_message
        self.rule = rule
        self.suggestions = list(suggestions or [])

    def to_dict(self) -> dict:
        d = super().to_dict()
        d.update(
            torch_exception=self.torch_exception,
            torch_message=self.torch_message,
            rule=self.rule,
            suggestions=list(self.suggestions),
        )
        return d


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


@dataclass
class Problem:
    """A non-fatal finding (a warning or a note) with the same structured fields as an error."""

    code: str
    message: str
    where: Optional[str] = None
    hint: Optional[str] = None
    severity: str = "warning"
    data: dict = field(default_factory=dict)

"""Problems found in a package, a tarball or a benchmark result, as values.

Every check in the contract returns :class:`Problem` values instead of raising:
a bad package is an expected outcome, not a bug. Each problem has a stable
``code`` agents can switch on, the ``file`` and ``field`` it concerns, and a
``hint`` that says what to do about it.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

ERROR = "error"
WARNING = "warning"


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending in "..." when cut (for one-line messages)."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclass(frozen=True)
class Problem:
    """One finding: ``severity`` is ``error`` (makes the subject invalid) or ``warning``."""

    code: str
    message: str
    severity: str = ERROR
    file: str | None = None
    field: str | None = None
    hint: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict with every field (``None`` where not applicable)."""
        return asdict(self)

    def render(self) -> str:
        """One human-readable line: ``error CODE file:field: message (hint)``."""
        where = ":".join(part for part in (self.file, self.field) if part)
        text = f"{self.severity} {self.code}"
        if where:
            text += f" {where}"
        text += f": {self.message}"
        if self.hint:
            text += f" — {self.hint}"
        return text


@dataclass(frozen=True)
class Report:
    """The outcome of a check over one subject (a package dir, a tarball, a result)."""

    subject: str
    problems: tuple[Problem, ...] = field(default_factory=tuple)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def errors(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.severity == ERROR)

    @property
    def warnings(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.severity == WARNING)

    @property
    def valid(self) -> bool:
        """True when there is no error (warnings do not invalidate)."""
        return not self.errors

    def with_problems(self, more: Iterable[Problem]) -> Report:
        """A copy with ``more`` problems appended."""
        return Report(self.subject, self.problems + tuple(more), dict(self.facts))

    def to_json(self) -> dict[str, Any]:
        """``{"subject", "valid", "problems": [...], "facts": {...}}`` for ``--json`` output."""
        return {
            "subject": self.subject,
            "valid": self.valid,
            "problems": [p.to_json() for p in self.problems],
            "facts": self.facts,
        }

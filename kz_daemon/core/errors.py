"""The one user-safe error type of the daemon and the HTTP shim.

Expected failures a user can cause (a bad package, an unknown uuid, a lease held by
another runner) are raised as :class:`ZooError` with a stable machine-readable
``code``, a message that says what to fix, and the HTTP status the shim answers
with. The HTTP layer maps it in exactly one handler; anything else is a bug and
is answered as a 500 without internals.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Stable codes and their HTTP status. Add new codes here, never reuse one for a
# different meaning: agents switch on them.
STATUS_BY_CODE: dict[str, int] = {
    "BAD_REQUEST": 400,
    "VALIDATION_ERROR": 400,
    "UNAUTHORIZED": 401,
    "FORBIDDEN": 403,
    "SUBMITTER_ID_BOUND": 403,
    "NOT_FOUND": 404,
    "REQUEST_TIMEOUT": 408,
    "CONFLICT": 409,
    "AMBIGUOUS_REV": 409,
    "AMBIGUOUS_ID": 409,
    "LEASE_LOST": 409,
    "NOT_CLAIMABLE": 409,
    "PAYLOAD_TOO_LARGE": 413,
    "UPLOAD_TRUNCATED": 400,
    "RESULT_INVALID": 422,
    "RATE_LIMITED": 429,
    "UNAVAILABLE": 503,
    "STORAGE_FULL": 503,
    # daemon core (kz_daemon.intake.admit / queue / accept / config)
    "PACKAGE_FROZEN": 409,
    "NEW_PACKAGE_NOT_ALLOWED": 403,
    "ARCH_MISMATCH": 409,
    "CONFIG_INVALID": 500,
}


@dataclass(frozen=True)
class ZooError(Exception):
    """An expected, user-caused failure: stable ``code``, human ``message``, JSON-able ``details``."""

    code: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def http_status(self) -> int:
        """The HTTP status this error is answered with (400 for an unlisted code)."""
        return STATUS_BY_CODE.get(self.code, 400)

    def to_json(self) -> dict[str, Any]:
        """The error body every endpoint answers with: ``{"error": {code, message, details}}``."""
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


# Frameworks write an exception's dunder attributes after raising it (Starlette clears
# ``__traceback__`` once its handler answered; ``add_note`` sets ``__notes__``). A frozen
# dataclass refuses every assignment, so let exactly those through.
_frozen_setattr = ZooError.__setattr__


def _setattr(self: ZooError, name: str, value: Any) -> None:
    if name.startswith("__") and name.endswith("__"):
        object.__setattr__(self, name, value)
        return
    _frozen_setattr(self, name, value)


ZooError.__setattr__ = _setattr  # type: ignore[method-assign, assignment]

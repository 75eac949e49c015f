"""The status words of a submission: one vocabulary for the reducer, daemon, HTTP, CLI and web.

A ``Status`` is a ``StrEnum``, so it compares equal to (and serialises as) its plain
word: ``Status.QUEUED == "queued"`` and ``json.dumps(Status.QUEUED) == '"queued"'``.
The lifecycle is drawn in ``kz_events.reducer``'s docstring.
"""
from __future__ import annotations

from enum import StrEnum

__all__ = ["Status", "STATUSES", "TERMINAL", "is_terminal"]


class Status(StrEnum):
    """Where a submission stands (in lifecycle order)."""

    RECEIVED = "received"     # the spool has it; intake has not judged it yet
    HELD = "held"             # valid, but a static rule asks an admin to review it before it is queued
    QUEUED = "queued"         # valid; waiting for a runner of its arch
    RUNNING = "running"       # claimed by a runner (or its result is being judged)
    ACCEPTING = "accepting"   # the accept saga is writing its two commits
    ACCEPTED = "accepted"     # committed; the scorecard names its source commit
    REJECTED = "rejected"     # refused: validation, a hard check, or the package's own verdict
    FAILED = "failed"         # infrastructure gave up (attempts exhausted, saga rolled back)
    CANCELLED = "cancelled"   # withdrawn by its submitter or an admin
    REVOKED = "revoked"       # was accepted; an admin took the record back (history kept)


#: every status word, in lifecycle order.
STATUSES: tuple[Status, ...] = tuple(Status)
#: the statuses a submission never leaves.
TERMINAL: frozenset[Status] = frozenset({Status.ACCEPTED, Status.REJECTED, Status.FAILED, Status.CANCELLED,
                                        Status.REVOKED})


def is_terminal(status: str) -> bool:
    """Whether ``status`` (a ``Status`` or its word) is final."""
    return status in TERMINAL

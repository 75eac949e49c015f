"""The read model of one submission: what the API, the CLI and the web pages show about it.

Built only from the fold of the event log (a reducer ``Submission``), never from
workflow fields kept elsewhere. A reason whose code stands for the server's own trouble
shows its fixed public message (``hints.PUBLIC_MESSAGES``), not the exception the event
recorded.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kz_daemon.core.hints import public_reason
from kz_events.events import CaseSummary
from kz_events.status import TERMINAL, Status

__all__ = ["SubmissionView", "view_of"]


@dataclass(frozen=True)
class SubmissionView:
    """What the API shows about one submission (built from the fold of the log)."""

    uuid: str
    kernel_id: str
    submitter_id: str
    status: str                      # a kz_events.status.Status word
    source: str = "spool"
    received_at: str = ""
    arch: str | None = None
    new_kernel: bool | None = None
    harness_change: bool = False     # a maintainer changed the kernel's locked harness files
    warnings: list = field(default_factory=list)
    attempts: int = 0
    runner_id: str | None = None
    lease_expires_at: float | None = None
    reasons: list = field(default_factory=list)   # [{stage, code, message, seq}]
    result: dict | None = None       # summary of the reported result
    cases: list = field(default_factory=list)     # the first run's CaseSummary entries (dicts)
    commit_sha: str | None = None    # SHA_src (commit 1): the SHA the API reports
    sha_br: str | None = None        # the scorecard commit (new HEAD)
    history: list = field(default_factory=list)   # [[seq, status, ts], ...]
    seq: int = 0                     # the log position this view was read at (for long polls)

    @property
    def terminal(self) -> bool:
        """Whether the status is final."""
        return self.status in TERMINAL


def view_of(sub: Any, seq: int) -> SubmissionView:
    """A SubmissionView of a reducer ``Submission`` read at log position ``seq``."""
    return SubmissionView(
        uuid=sub.uuid, kernel_id=sub.kernel_id, submitter_id=sub.submitter_id, status=sub.status,
        source=sub.source, received_at=sub.received_at, arch=sub.arch, new_kernel=sub.new_kernel,
        harness_change=bool(getattr(sub, "harness_change", False)),
        warnings=list(sub.warnings), attempts=sub.attempts, runner_id=sub.runner_id,
        lease_expires_at=sub.lease_expires_at, reasons=[dict(public_reason(r)) for r in sub.reasons],
        result=dict(sub.result) if sub.result else None,
        cases=[CaseSummary.from_json(c).to_json() for c in getattr(sub, "cases", None) or ()],
        commit_sha=sub.sha_src, sha_br=sub.sha_br, history=[list(h) for h in sub.history], seq=seq)


def not_yet_seen(sub_uuid: str, seq: int) -> SubmissionView:
    """The view of a submission the log does not know yet (the spool has it, intake has not judged it)."""
    return SubmissionView(uuid=sub_uuid, kernel_id="", submitter_id="", status=Status.RECEIVED, seq=seq)

"""Recent submissions for the web pages, read from the event log's read model, and fix hints.

The store lists submissions newest first across the live State and the history
projection of finished ones (``Store.select``, indexed by kernel, submitter and
status). A page asks for its rows and those before it plus one (to know whether an
older page exists), so the cost follows the page asked for, not the size of the log.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kz_daemon.config.ports import Daemon
from kz_events.log.history import Query
from kz_events.state import Submission
from kz_events.status import STATUSES

PAGE_SIZE = 50

@dataclass(frozen=True)
class Filters:
    """What the submissions page filters on (empty = any)."""

    kernel: str = ""
    submitter: str = ""
    status: str = ""

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> Filters:
        """Filters from query parameters; an unknown status word is ignored."""
        status = str(query.get("status", "")).strip()
        return cls(kernel=str(query.get("kernel", "")).strip(), submitter=str(query.get("submitter", "")).strip(),
                   status=status if status in STATUSES else "")

    def match(self, sub: Submission) -> bool:
        """Whether a read-model submission passes (kernel: exact id or a folder prefix)."""
        if self.kernel and sub.kernel_id != self.kernel and not sub.kernel_id.startswith(self.kernel.rstrip("/") + "/"):
            return False
        if self.submitter and sub.submitter_id != self.submitter:
            return False
        return not self.status or sub.status == self.status


def row_of(sub: Submission) -> dict[str, Any]:
    """A plain row for the pages from a read-model submission."""
    reasons = [dict(r) for r in sub.reasons or []]
    history = [list(h) for h in sub.history or []]
    return {"uuid": sub.uuid, "kernel_id": sub.kernel_id, "submitter_id": sub.submitter_id,
            "status": str(sub.status), "received_at": sub.received_at or "",
            "updated_at": history[-1][2] if history and len(history[-1]) > 2 else "",
            "attempts": sub.attempts, "commit_sha": sub.sha_src,
            "code": reasons[-1].get("code", "") if reasons else "",
            "message": reasons[-1].get("message", "") if reasons else "",
            "new_kernel": bool(sub.new_kernel), "harness_change": bool(sub.harness_change)}


def recent(zoo: Daemon, filters: Filters, page: int = 1, per_page: int = PAGE_SIZE) -> tuple[list[dict[str, Any]], bool]:
    """Rows of page ``page`` (newest first) and whether an older page exists."""
    skip = (page - 1) * per_page
    query = Query(submitter=filters.submitter or None, kernel_prefix=filters.kernel or None,
                  status=filters.status or None)
    subs = zoo.store.select(query, limit=skip + per_page + 1)[skip:]
    return [row_of(sub) for sub in subs[:per_page]], len(subs) > per_page

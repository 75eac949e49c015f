"""Human review: submissions a static rule holds (status ``held``) wait here for an admin's decision.

:func:`held` lists them with the evidence intake recorded (``pending/<uuid>/
submission.json``); :func:`decide` emits ``submission.reviewed``: ``approve`` queues
the job in its original place in line, ``reject`` ends it (``rejected``, code
REVIEW_REJECTED, the reason shown to the submitter). Only admins decide (the HTTP
layer and ``kz review`` check that); the decision names who made it.
"""
from __future__ import annotations

import json

from kz_daemon.config.ports import Daemon
from kz_daemon.core.errors import ZooError
from kz_daemon.storage.pending import SUBMISSION_FILE
from kz_events import events as ev
from kz_events.status import Status

__all__ = ["DECISIONS", "held", "decide", "evidence_of"]

DECISIONS = ("approve", "reject")


def _evidence(zoo: Daemon, sub_uuid: str) -> list:
    try:
        doc = json.loads((zoo.pending.folder(sub_uuid) / SUBMISSION_FILE).read_text())
    except (OSError, ValueError):
        return []
    held_findings = (doc.get("outcome") or {}).get("held")
    return held_findings if isinstance(held_findings, list) else []


def evidence_of(zoo: Daemon, sub_uuid: str) -> list:
    """The findings ({rule, action, file, line, text}) that held ``sub_uuid`` at intake ([] when none)."""
    return _evidence(zoo, sub_uuid)


def held(zoo: Daemon) -> list[dict]:
    """Every held submission, oldest first: uuid, kernel_id, submitter, received_at, rules, evidence."""
    with zoo.store.lock:
        subs = [s for s in zoo.store.state.submissions.values() if s.status == Status.HELD]
        rows = [{"uuid": s.uuid, "kernel_id": s.kernel_id, "submitter_id": s.submitter_id, "arch": s.arch,
                 "received_at": s.received_at, "held_at": s.history[-1][2], "seq": s.history[-1][0]}
                for s in subs]
    rows.sort(key=lambda r: r["seq"])
    for row in rows:
        row["evidence"] = _evidence(zoo, row["uuid"])
        row["rules"] = sorted({str(f.get("rule")) for f in row["evidence"] if isinstance(f, dict)})
    return rows


def decide(zoo: Daemon, sub_uuid: str, decision: str, by: str, reason: str = "") -> None:
    """Approve (queue) or reject a held submission; NOT_FOUND, CONFLICT when it is not held."""
    if decision not in DECISIONS:
        raise ZooError("BAD_REQUEST", f"a review decision is approve or reject, not {decision!r}")
    if decision == "reject" and not reason.strip():
        reason = "rejected by an admin after review"
    with zoo.lock, zoo.store.lock:
        sub = zoo.store.state.submissions.get(sub_uuid) or zoo.store.submission(sub_uuid)
        if sub is None:
            raise ZooError("NOT_FOUND", f"no submission {sub_uuid}", {"uuid": sub_uuid})
        if sub.status != Status.HELD:
            raise ZooError("CONFLICT", f"submission {sub_uuid} is {sub.status}, not held for review",
                           {"status": sub.status})
        ticket = zoo.store.submit(ev.SubmissionReviewed(uuid=sub_uuid, decision=decision, by=by,
                                                        reason=reason))
    ticket.wait()

"""Human review: submissions a static rule holds (status ``held``) wait here for an admin's decision.

:func:`held` lists them with the evidence intake recorded (``pending/<uuid>/
submission.json``); :func:`decide` emits ``submission.reviewed``: ``approve`` queues
the job in its original place in line, ``reject`` ends it (``rejected``, code
REVIEW_REJECTED, the reason shown to the submitter). Only admins decide (the HTTP
layer and ``kz review`` check that); the decision names who made it.

Harnesses are reviewed here too (``kz_daemon.guards.harness_review`` says which are):
:func:`unreviewed_harnesses` lists the kernels whose harness at HEAD a submission
brought and no admin approved, with where to read it; :func:`review_harness` emits
``harness.reviewed``: ``approve`` names the hash of HEAD's harness (the kernel ranks
from then on), ``revoke`` takes an approval back (it no longer does).
"""
from __future__ import annotations

import json
import re
from typing import Any

from kz_daemon.config.ports import Daemon
from kz_daemon.core.errors import ZooError
from kz_daemon.guards.harness_review import HarnessDigests, is_unreviewed, review_of, reviews_of
from kz_daemon.storage.pending import SUBMISSION_FILE
from kz_events import events as ev
from kz_events.status import Status
from kz_runner.contract.layout import BENCHMARK, KP

__all__ = ["DECISIONS", "HARNESS_DECISIONS", "held", "decide", "evidence_of", "unreviewed_harnesses",
           "review_harness"]

DECISIONS = ("approve", "reject")
HARNESS_DECISIONS = ("approve", "revoke")
#: a harness hash as a reviewer may give it: the full sha256 hex, or a prefix of at least 8 digits
HASH_PREFIX = re.compile(r"^[0-9a-f]{8,64}$")


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


# -- harnesses --------------------------------------------------------------------------------------

def _head(zoo: Daemon) -> str | None:
    with zoo.git_lock:
        return zoo.git.head()


def _standing(zoo: Daemon, digests: HarnessDigests, kernel_id: str, head: str | None
              ) -> tuple[str | None, list[tuple[str, str, str | None]], frozenset[str]]:
    """``(harness hash at head, [(uuid, sha_src, hash)] of the accepts that brought one, approved hashes)``."""
    brought, approved = reviews_of(zoo.store, [kernel_id]).get(kernel_id, ({}, frozenset()))
    pairs = [(sha, kernel_id) for sha in brought.values()] + ([(head, kernel_id)] if head else [])
    found = digests.of(pairs)
    current = found[(head, kernel_id)] if head else None
    return current, [(uuid, sha, found[(sha, kernel_id)]) for uuid, sha in brought.items()], approved


def _links(kernel_id: str, commit: str) -> dict[str, str]:
    """Where a reviewer reads a kernel's harness at a record: the files (API), the source page, the diff, git."""
    return {"path": f"{kernel_id}/{KP}/", "files_url": f"/api/kernels/{kernel_id}/files?rev={commit}",
            "source_url": f"/kernels/{kernel_id}/source?rev={commit}&path={KP}/{BENCHMARK}",
            "diff_url": f"/kernels/{kernel_id}/diff?to={commit}"}


def unreviewed_harnesses(zoo: Daemon, digests: HarnessDigests) -> list[dict[str, Any]]:
    """Every kernel whose harness at HEAD is unreviewed, by kernel_id: its hash, the accept that brought it, links."""
    head = _head(zoo)
    if head is None:
        return []
    reviews = reviews_of(zoo.store)
    rows = []
    for kernel_id in sorted(reviews):
        current, bringers, approved = _standing(zoo, digests, kernel_id, head)
        if not is_unreviewed(current, (digest for _uuid, _sha, digest in bringers), approved):
            continue
        uuid, sha, _digest = [b for b in bringers if b[2] == current][-1]  # the newest accept that brought it
        with zoo.git_lock:
            trailers = zoo.git.commit_info(sha).trailers
        rows.append({"kernel_id": kernel_id, "harness_hash": current, "commit": sha, "submission": uuid,
                     "submitter_id": trailers.get("Kz-Submitter", ""), "approved": sorted(approved),
                     **_links(kernel_id, sha)})
    return rows


def _pick(candidates: list[str], given: str, kernel_id: str, what: str) -> str:
    hits = [h for h in candidates if h.startswith(given)]
    if len(hits) != 1:
        raise ZooError("CONFLICT", f"{len(hits) or 'no'} {what} of {kernel_id} start with {given!r}"
                       + ("; give more digits" if hits else "; kz review harness list shows the unreviewed ones"),
                       {"kernel_id": kernel_id, "harness_hash": given, "candidates": hits})
    return hits[0]


def review_harness(zoo: Daemon, digests: HarnessDigests, kernel_id: str, decision: str, by: str,
                   harness_hash: str | None = None, reason: str = "") -> dict[str, Any]:
    """Approve the harness at HEAD (``harness_hash``, when given, must be its hash or a prefix of it), or revoke an
    approval (of ``harness_hash``, else of HEAD's harness); emits ``harness.reviewed`` and answers what was decided.

    NOT_FOUND for a kernel neither at HEAD nor ever approved; CONFLICT when there is nothing to decide: the
    harness changed since the reviewer read it, is approved already, is its maintainers' own (no submission
    brought it), or is not approved.
    """
    if decision not in HARNESS_DECISIONS:
        raise ZooError("BAD_REQUEST", f"a harness review is approve or revoke, not {decision!r}")
    if harness_hash is not None and not HASH_PREFIX.match(harness_hash):
        raise ZooError("BAD_REQUEST", "harness_hash must be 8 to 64 lower-case hex digits of the harness's hash "
                       "(kz review harness list shows it)", {"field": "harness_hash"})
    with zoo.lock:
        head = _head(zoo)
        current, bringers, approved = _standing(zoo, digests, kernel_id, head)
        if current is None and not approved:
            raise ZooError("NOT_FOUND", f"no kernel {kernel_id!r} in the repo; GET /api/kernels lists them",
                           {"kernel_id": kernel_id})
        if decision == "approve":
            if current is None:
                raise ZooError("NOT_FOUND", f"{kernel_id} is not at HEAD: there is no harness to approve",
                               {"kernel_id": kernel_id})
            if harness_hash is not None and not current.startswith(harness_hash):
                raise ZooError("CONFLICT", f"the harness of {kernel_id} at HEAD is {current}, not {harness_hash}: "
                               "it changed since; read it again (kz review harness list)",
                               {"kernel_id": kernel_id, "harness_hash": current, "given": harness_hash})
            if current in approved:
                raise ZooError("CONFLICT", f"harness {current[:12]} of {kernel_id} is approved already",
                               {"kernel_id": kernel_id, "harness_hash": current})
            if current not in {digest for _uuid, _sha, digest in bringers}:
                raise ZooError("CONFLICT", f"the harness of {kernel_id} is its maintainers' own (no submission "
                               "brought it): it ranks without a review", {"kernel_id": kernel_id,
                                                                          "harness_hash": current})
            target = current
        else:
            if harness_hash is not None:
                target = _pick(sorted(approved), harness_hash, kernel_id, "approved harnesses")
            elif current in approved:
                target = current
            else:
                raise ZooError("CONFLICT", f"the harness of {kernel_id} at HEAD is not approved: nothing to revoke",
                               {"kernel_id": kernel_id, "harness_hash": current, "approved": sorted(approved)})
        commit = next((sha for _uuid, sha, digest in reversed(bringers) if digest == target), None)
        with zoo.store.lock:
            ticket = zoo.store.submit(ev.HarnessReviewed(kernel_id=kernel_id, harness_hash=target, decision=decision,
                                                         commit=commit, by=by, reason=reason))
    ticket.wait()
    return {"kernel_id": kernel_id, "harness_hash": target, "decision": decision, "by": by, "reason": reason,
            "commit": commit, "harness": review_of(zoo.store, digests, kernel_id, head)}

"""The event log anchored in git: each accept commit carries the log's chain head.

The hash chain shows an edit inside the log, but not a log rewritten whole with a
fresh chain. Each commit of an accept saga therefore carries the chain head at that
moment as a trailer, ``Event-Log-Head: <seq>:<sha256 of that line>``; git history is
pushed to the mirrors, so rewriting the log now also means rewriting git and every
mirror. :func:`audit` checks every anchor against the log
(``kz_events.read.audit.check_anchors``) and every commit's ``Kz-Submission``,
``Kz-Submitter`` and ``Kz-Runner`` trailers against the log's events.

What this does not promise: it is tamper-evidence, not a signature. Whoever can
rewrite the log, git and every mirror together can make them agree again.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kz_events.read.audit import check_anchors

TRAILER = "Event-Log-Head"
_HEAD_RE = re.compile(r"^(\d+):([0-9a-f]{64})$")


def format_head(seq: int, sha: str) -> str:
    """The trailer value for chain head ``(seq, sha)``."""
    return f"{seq}:{sha}"


def head_of(zoo: Any) -> dict[str, str]:
    """The trailer for the store's current chain head, to add to a commit's trailers."""
    return {TRAILER: format_head(*zoo.store.chain_head())}


def parse_head(value: str | None) -> tuple[int, str] | None:
    """``(seq, sha)`` from a trailer value; None when it is not one."""
    match = _HEAD_RE.match((value or "").strip())
    return (int(match.group(1)), match.group(2)) if match else None


def _finding(code: str, message: str, uuid: str | None = None, sha: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "uuid": uuid, "sha": sha}


def audit(events_dir: Path, state: Any, history: Iterable[Any]) -> list[dict[str, Any]]:
    """Anchors and kz trailers of every commit in ``history`` against the log (its ``state``).

    Each finding is ``{code, message, uuid, sha}`` (``kz_daemon.ops.repo_audit.RepoFinding``'s fields):
    ANCHOR_MISMATCH / ANCHOR_MISSING (the log no longer holds what a commit recorded),
    ANCHOR_MALFORMED, TRAILER_MISMATCH (a trailer disagrees with the log's events).
    """
    out: list[dict[str, Any]] = []
    anchors: dict[tuple[int, str], list[str]] = {}
    subs = state.submissions
    for info in history:
        trailers = info.trailers
        if TRAILER in trailers:
            head = parse_head(trailers.get(TRAILER))
            if head is None:
                out.append(_finding("ANCHOR_MALFORMED", f"{TRAILER} {trailers.get(TRAILER)!r} is not <seq>:<sha256>",
                                   sha=info.sha))
            else:
                anchors.setdefault(head, []).append(info.sha)
        sub_uuid = trailers.get("Kz-Submission")
        sub = subs.get(sub_uuid) if sub_uuid else None
        if sub is None or trailers.get("Kz-Step") not in ("source", "scorecard"):
            continue  # an unknown uuid is COMMIT_WITHOUT_EVENTS (kz_daemon.ops.repo_audit)
        for name, logged in (("Kz-Submitter", sub.submitter_id), ("Kz-Runner", sub.runner_id or "unknown")):
            if name in trailers and trailers[name] != logged:
                out.append(_finding("TRAILER_MISMATCH", f"{name} {trailers[name]!r} but the log says {logged!r}",
                                   uuid=sub_uuid, sha=info.sha))
    for finding in check_anchors(events_dir, anchors):
        head = next((h for h in anchors if h[0] == finding.seq), None)
        for sha in anchors.get(head, []) if head else []:
            out.append(_finding(finding.code, f"{finding.message}: the log at seq {finding.seq} is not what this "
                               "commit recorded; the log was rewritten after it (kz audit, then restore the "
                               "log from a backup or mirror)", sha=sha))
    return out

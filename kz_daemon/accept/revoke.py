"""Revocation: an admin takes an accepted record back, append-only (history is never rewritten).

The revocation is a small saga keyed by the submission uuid, like the accept saga;
each step looks at what already happened and does only what is missing:

1. ``submission.revoked`` (uuid, by, reason): the submission goes from ``accepted`` to
   the terminal ``revoked``;
2. the revocation commit on the branch: the kernel's folder as if the record had never
   been accepted (:func:`restored_folder`): the source area and harness of the latest
   record that still stands (its source commit's files), or of the kernel before its first
   logged accept when none does (no folder for a kernel that one created), and that
   record's ``bench_result.yaml`` (its ``metrics_current`` and ``correctness_current``)
   with every metric's ``metrics_best``, primary and secondary, rebuilt from the records
   that stand. It is made even when nothing changes (then it changes no file), so every
   revocation is in git history; a saga half-way in git (its source commit at HEAD) is
   finished first. Trailers: ``Revokes: <uuid>``, ``Revoked-By: <who>``,
   ``Kz-Submission``, ``Kz-Submitter``, ``Kz-Runner``, ``Kz-Step: revoke``;
3. index.json updated for the kernel, then ``revoke.committed`` (uuid, sha, best_changed).

A kill between the steps is finished at the next start-up (:func:`recover`): the commit
is found by its ``Revokes`` trailer after the accept's scorecard commit, so it is never
made twice. ``KZ_CRASH_AT=after_revoke_event|after_revoke_commit`` kills the process
there (the crash tests' fault injection).
"""
from __future__ import annotations

import os
import signal

from kz_daemon.accept.saga import EarlierSagaPending, finish_earlier_saga
from kz_daemon.config.ports import Daemon
from kz_daemon.core import scorecard
from kz_daemon.core.errors import ZooError
from kz_daemon.storage.gitstore import format_message
from kz_daemon.storage.history import REVOKE_STEP
from kz_events import events as ev
from kz_events.state import Submission
from kz_events.status import Status
from kz_runner.contract.layout import BENCH_RESULT, BENCHMARK, KP
from kz_runner.contract.rules.pysource import read_metas

__all__ = ["CRASH_POINTS", "REVOKE_STEP", "revocation", "revoke", "finish", "restored_folder", "recover"]

CRASH_POINTS = ("after_revoke_event", "after_revoke_commit")


def _crash_point(name: str) -> None:
    if os.environ.get("KZ_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def revocation(sub: Submission) -> dict | None:
    """The revocation entry of a submission's reasons ({by, message, seq, sha, ...}), or None."""
    return next((r for r in reversed(sub.reasons) if r.get("stage") == "revoke"), None)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:200] or "unknown"


def revoke(zoo: Daemon, sub_uuid: str, by: str, reason: str) -> str:
    """Revoke an accepted submission and finish its saga; returns the revocation commit's SHA.

    NOT_FOUND for an unknown uuid; CONFLICT unless it is ``accepted`` (a ``revoked`` one is
    finished again and answers with its commit: the call is idempotent); VALIDATION_ERROR
    without a reason.
    """
    if not str(reason).strip():
        raise ZooError("VALIDATION_ERROR", "a revocation needs a reason", {"field": "reason"})
    with zoo.lock, zoo.store.lock:
        sub = zoo.store.submission(sub_uuid)  # finished: from the history projection
        if sub is None:
            raise ZooError("NOT_FOUND", f"no submission {sub_uuid}", {"uuid": sub_uuid})
        if sub.status not in (Status.ACCEPTED, Status.REVOKED):
            raise ZooError("CONFLICT", f"submission {sub_uuid} is {sub.status}; only an accepted record "
                           "can be revoked", {"uuid": sub_uuid, "status": sub.status})
        if sub.status == Status.ACCEPTED:
            zoo.store.emit(ev.SubmissionRevoked(uuid=sub_uuid, by=_one_line(by), reason=str(reason).strip()))
    _crash_point("after_revoke_event")
    return finish(zoo, sub_uuid)


def finish(zoo: Daemon, sub_uuid: str) -> str:
    """Drive the revocation saga of a ``revoked`` submission to its end; its commit SHA. Idempotent."""
    with zoo.git_lock:
        sub = zoo.store.submission(sub_uuid)
        entry = revocation(sub) if sub is not None else None
        if sub is None or entry is None:
            raise ZooError("CONFLICT", f"submission {sub_uuid} was not revoked", {"uuid": sub_uuid})
        if entry.get("sha"):
            return entry["sha"]
        kid = sub.kernel_id
        path = f"{kid}/{KP}/{BENCH_RESULT}"
        found = zoo.git.find_commits("Revokes", sub_uuid, since=sub.sha_br)
        if found:
            sha = found[-1].sha
            parents = zoo.git.commit_info(sha).parents
            changed = zoo.git.read_file(path, sha) != zoo.git.read_file(path, parents[0] if parents else None)
        else:
            try:  # the two commits of an accept stay adjacent: a saga half-way in git finishes first
                finish_earlier_saga(zoo, sub_uuid)
            except EarlierSagaPending as exc:
                raise ZooError("CONFLICT", f"the revocation of {sub_uuid} waits for an accept half-way in git; "
                               "revoke again once it finished (the next start-up finishes both)",
                               {"uuid": sub_uuid, "reason": str(exc)}) from exc
            head = zoo.git.head()
            folder = restored_folder(zoo, sub)
            card = folder.get(path)
            changed = (card[0] if card else None) != zoo.git.read_file(path, head)
            trailers = {"Kz-Submission": sub_uuid, "Kz-Submitter": sub.submitter_id,
                        "Kz-Runner": sub.runner_id or "unknown", "Kz-Step": REVOKE_STEP,
                        "Revokes": sub_uuid, "Revoked-By": _one_line(entry.get("by", "admin"))}
            message = format_message(f"revoke {kid} (submission {sub_uuid[:8]})", trailers,
                                     body=str(entry.get("message", "")))
            sha = zoo.git.commit_changes(folder, message, zoo.config.repo.author, head)
            _crash_point("after_revoke_commit")
        zoo.indexer.update([kid])
        zoo.store.emit(ev.RevokeCommitted(uuid=sub_uuid, sha=sha, best_changed=bool(changed)))
    zoo.after_accept(sha)
    return sha


def _accept_seq(sub: Submission) -> int:
    return next((seq for seq, status, _ts in sub.history if status == Status.ACCEPTED), 0)


def restored_folder(zoo: Daemon, sub: Submission) -> dict[str, tuple[bytes, int] | None]:
    """The changes that give the kernel's folder at HEAD as if ``sub`` had never been accepted.

    ``{kernel_id: None, path: (bytes, mode), ...}``: the folder replaced wholesale by the
    files of the latest record that stands (the kernel's accepted, non-revoked
    submissions, in accept order; its SHA_br holds its source files and its scorecard), or
    by the folder before the kernel's first logged accept when none stands (nothing: the
    folder goes). In the scorecard every metric's ``metrics_best`` is rebuilt
    (:func:`~kz_daemon.core.scorecard.recompute_best`): the baseline is the scorecard
    before the first logged accept (commit 1 of an accept keeps the old card), then the
    ``metrics_current`` each standing record committed; the METAS are the restored
    benchmark.py's. A pure function of the log and git: a retried revocation computes the
    same tree.
    """
    kid = sub.kernel_id
    path = f"{kid}/{KP}/{BENCH_RESULT}"
    ever = sorted((s for s in zoo.store.kernel_records(kid, (Status.ACCEPTED, Status.REVOKED)) if s.sha_br),
                  key=_accept_seq)
    baseline = scorecard.load(zoo.git.read_file(path, ever[0].sha_src)) if ever else None
    standing = [s for s in ever if s.status == Status.ACCEPTED and s.uuid != sub.uuid]
    runs = [scorecard.load(zoo.git.read_file(path, s.sha_br)) for s in standing]
    if standing:
        source: str | None = standing[-1].sha_br
    else:  # nothing stands: the kernel as it was before its first logged accept
        first_src = (ever[0] if ever else sub).sha_src
        assert first_src is not None  # an accepted record has its source commit
        parents = zoo.git.commit_info(first_src).parents
        source = parents[0] if parents else None
    folder: dict[str, tuple[bytes, int] | None] = {kid: None}
    if source is not None:
        for file, mode, _blob in zoo.git.walk_files(kid, source):
            data = zoo.git.read_file(file, source)
            assert data is not None  # walk_files yields files only
            folder[file] = (data, mode)
    stored = folder.get(path)  # a file, never the folder's None
    card = scorecard.load(stored[0]) if stored is not None else None
    if stored is not None and card is not None:
        bench = folder.get(f"{kid}/{KP}/{BENCHMARK}")
        metas, _problems = read_metas(bench[0]) if bench else (None, [])
        if not metas:
            try:
                metas = zoo.pending.metas(sub.uuid)
            except (OSError, ValueError):
                metas = []  # without the METAS every metric of the card is taken as lower_better
        folder[path] = (scorecard.dump(scorecard.recompute_best(card, metas, baseline, runs)), stored[1])
    return folder


def recover(zoo: Daemon) -> list[str]:
    """Finish every revocation a crash left without its ``revoke.committed``; the uuids finished."""
    with zoo.store.lock:  # revocations whose commit is not recorded: the State keeps their uuids
        unfinished = list(zoo.store.state.revoking)
    for sub_uuid in unfinished:
        finish(zoo, sub_uuid)
    return unfinished

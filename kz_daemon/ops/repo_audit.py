"""Audit a state directory: the event log against the git history and index.json.

``audit_state_dir(DIR)`` is read-only (it replays the log without its lock, so it
works beside a running daemon) and returns :class:`RepoFinding` values, empty when
everything agrees:

- every accepted submission has exactly its two commits: the source commit
  (SHA_src, trailer ``Kz-Step: source``) and on top of it the scorecard commit
  (SHA_br, ``Kz-Step: scorecard``, subject ``bench_result update (source <7>)``)
  whose bench_result.yaml carries no ``__PENDING_COMMIT__``;
- no commit with a ``Kz-Submission`` trailer lacks its events (a saga still
  ``accepting`` is a warning: the next start-up finishes it);
- a revoked submission keeps its two commits and has exactly one revocation commit
  (``Kz-Step: revoke``, ``Revokes: <uuid>``) after them; an accepted one has none;
- the branch head is the scorecard commit of the last completed accept, or the last
  revocation commit when that came later (unless
  later commits carry no kz trailer, e.g. an operator's commit: a warning);
- index.json equals a full rebuild at HEAD. A running daemon writes index.json
  when accepts pause (up to ~5 s behind HEAD): while the event log's lock is held,
  an index.json recorded at an earlier commit is a warning (INDEX_BEHIND) and is
  checked against a rebuild at its own commit; with no daemon running it is an
  error (INDEX_STALE), since a clean stop always leaves it at HEAD.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kz_daemon.accept import indexer
from kz_daemon.accept.revoke import REVOKE_STEP, revocation
from kz_daemon.config.settings import Config
from kz_daemon.storage import anchor
from kz_daemon.storage.gitstore import WORKTREE_MARK, GitStore
from kz_events.log.reading import replay_finished
from kz_events.status import Status
from kz_runner.contract.layout import PENDING_COMMIT

VOLATILE_INDEX_KEYS = ("generated_at", "built_at")


@dataclass(frozen=True)
class RepoFinding:
    """One disagreement between the log, git and the index."""

    code: str            # ACCEPT_COMMITS, COMMIT_WITHOUT_EVENTS, DUPLICATE_COMMIT, HEAD_MISMATCH,
                         # PENDING_IN_SCORECARD, INDEX_STALE, INDEX_BEHIND, INDEX_MISSING,
                         # SAGA_IN_PROGRESS; kz_daemon.storage.anchor: ANCHOR_MISMATCH, ANCHOR_MISSING,
                         # ANCHOR_MALFORMED, TRAILER_MISMATCH
    message: str
    severity: str = "error"     # "warning": recovery at the next start fixes it
    uuid: str | None = None
    sha: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)

    def __str__(self) -> str:
        where = " ".join(x for x in (self.uuid and f"submission {self.uuid}", self.sha and f"commit {self.sha[:12]}") if x)
        return f"[{self.code}] {where + ': ' if where else ''}{self.message}"


def _strip(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _strip(v) for k, v in doc.items() if k not in VOLATILE_INDEX_KEYS}
    if isinstance(doc, list):
        return [_strip(v) for v in doc]
    return doc


def daemon_running(events_dir: str | Path) -> bool:
    """Whether a process holds the event log's writer lock (``events/LOCK``, flock(2)).

    The writer takes ``LOCK_EX | LOCK_NB`` (kz_events.log.segments); a shared try-lock here
    fails exactly while it is held, and is let go at once.
    """
    try:
        fd = os.open(Path(events_dir) / "LOCK", os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def audit_state_dir(state_dir: str | Path, config_file: str | Path | None = None) -> list[RepoFinding]:
    """Compare the event log with git history and index.json; the findings (empty: consistent)."""
    config = Config.load(state_dir, config_file)
    running = daemon_running(config.paths.events)
    findings: list[RepoFinding] = []
    git = GitStore.open(config.paths.repo, config.repo.branch)
    try:
        # the log replayed on its own (not the daemon's projection), keeping of the finished
        # submissions only those git can speak of: accepted or revoked ones, and any a commit names
        named = {info.trailers.get("Kz-Submission") for info in git.log()} - {None}
        live, records = replay_finished(config.paths.events,
                                        keep=lambda s: s.status == Status.ACCEPTED or s.uuid in named)
        state = SimpleNamespace(submissions={**records, **live.submissions}, index_head=live.index_head)
        findings += _audit_commits(state, git)
        findings += [RepoFinding(**f) for f in anchor.audit(config.paths.events, state, git.log())]
        findings += _audit_index(config, state, git, running)
    finally:
        git.close()
    return findings


def _audit_commits(state, git) -> list[RepoFinding]:
    out: list[RepoFinding] = []
    by_uuid: dict[str, dict[str, list]] = {}
    history = list(git.log())
    for info in history:
        sub_uuid = info.trailers.get("Kz-Submission")
        if sub_uuid:
            by_uuid.setdefault(sub_uuid, {}).setdefault(info.trailers.get("Kz-Step", "?"), []).append(info)
    subs = state.submissions
    for sub_uuid, steps in by_uuid.items():
        for step, commits in steps.items():
            if len(commits) > 1:
                out.append(RepoFinding("DUPLICATE_COMMIT", f"{len(commits)} {step} commits for one submission",
                                   uuid=sub_uuid, sha=commits[0].sha))
        sub = subs.get(sub_uuid)
        if sub is None or sub.status not in ("accepted", "accepting", "revoked"):
            status = sub.status if sub else "unknown to the log"
            for commits in steps.values():
                out.append(RepoFinding("COMMIT_WITHOUT_EVENTS", f"commit of a submission that is {status}",
                                   uuid=sub_uuid, sha=commits[0].sha))
        elif sub.status == "accepting":
            out.append(RepoFinding("SAGA_IN_PROGRESS", "accept saga not finished (the next start-up finishes it)",
                               severity="warning", uuid=sub_uuid))
    accepted = [s for s in subs.values() if s.status in ("accepted", "revoked")]  # revoked: commits kept
    out += _audit_revocations(accepted, by_uuid)
    for sub in accepted:
        steps = by_uuid.get(sub.uuid, {})
        src = [c.sha for c in steps.get("source", [])]
        br = steps.get("scorecard", [])
        if src != [sub.sha_src] or [c.sha for c in br] != [sub.sha_br]:
            out.append(RepoFinding("ACCEPT_COMMITS", f"expected source {sub.sha_src} and scorecard {sub.sha_br} in "
                               f"history, found source {src} and scorecard {[c.sha for c in br]}", uuid=sub.uuid))
            continue
        commit2 = br[0]
        if commit2.parents != (sub.sha_src,) or commit2.subject != f"bench_result update (source {sub.sha_src[:7]})":
            out.append(RepoFinding("ACCEPT_COMMITS", "the scorecard commit is not the source commit's child with the "
                               "expected subject", uuid=sub.uuid, sha=commit2.sha))
        card = git.read_file(f"{sub.kernel_id}/.kernel_package/bench_result.yaml", sub.sha_br) or b""
        if PENDING_COMMIT.encode() in card:
            out.append(RepoFinding("PENDING_IN_SCORECARD", "bench_result.yaml still holds __PENDING_COMMIT__",
                               uuid=sub.uuid, sha=sub.sha_br))
    if accepted:
        last = _last_kz_commit(accepted)
        head = git.head()
        if head != last.sha_br:
            later = []
            for info in history:
                if info.sha == last.sha_br:
                    break
                later.append(info)
            kz_later = [c for c in later if "Kz-Submission" in c.trailers]
            if kz_later or not any(c.sha == last.sha_br for c in history):
                out.append(RepoFinding("HEAD_MISMATCH", f"branch head {head} is not the last accept's scorecard "
                                   f"commit {last.sha_br}", uuid=last.uuid, sha=head))
            else:
                out.append(RepoFinding("HEAD_MISMATCH", f"{len(later)} commit(s) without kz trailers after the last "
                                   "accept", severity="warning", sha=head))
    return out


def _audit_revocations(subs: list, by_uuid: dict) -> list[RepoFinding]:
    """A revoked submission has exactly its revocation commit (``Revokes: <uuid>``); an accepted one none."""
    out: list[RepoFinding] = []
    for sub in subs:
        commits = by_uuid.get(sub.uuid, {}).get(REVOKE_STEP, [])
        entry = revocation(sub)
        if sub.status == "accepted":
            if commits:
                out.append(RepoFinding("COMMIT_WITHOUT_EVENTS", "revocation commit of a submission the log has as "
                                   "accepted", uuid=sub.uuid, sha=commits[0].sha))
        elif entry is None or not entry.get("sha"):
            out.append(RepoFinding("SAGA_IN_PROGRESS", "revocation not finished (the next start-up finishes it)",
                               severity="warning", uuid=sub.uuid))
        elif [c.sha for c in commits] != [entry["sha"]] or commits[0].trailers.get("Revokes") != sub.uuid:
            out.append(RepoFinding("REVOKE_COMMIT", f"expected the revocation commit {entry['sha']} with trailer "
                               f"Revokes: {sub.uuid}, found {[c.sha for c in commits]}", uuid=sub.uuid))
    return out


def _last_kz_commit(subs: list) -> SimpleNamespace:
    """The commit the branch should end at: the latest (by log seq) accept's scorecard commit or revocation commit."""
    seq, sha, uuid = -1, None, None
    for sub in subs:
        accepted_seq = next((q for q, status, _ts in sub.history if status == "accepted"), 0)
        if accepted_seq > seq:
            seq, sha, uuid = accepted_seq, sub.sha_br, sub.uuid
        entry = revocation(sub) or {}
        if entry.get("sha") and entry.get("committed_seq", 0) > seq:
            seq, sha, uuid = entry["committed_seq"], entry["sha"], sub.uuid
    return SimpleNamespace(sha_br=sha, uuid=uuid)


def _audit_index(config, state, git, running: bool = False) -> list[RepoFinding]:
    head = git.head()
    if head is None:
        return []
    try:
        current = json.loads(config.paths.index.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return [RepoFinding("INDEX_MISSING", f"{config.paths.index} is missing or not JSON")]
    at = current.get("head") if isinstance(current, dict) else None
    out: list[RepoFinding] = []
    if at != head:
        if not running:
            return [RepoFinding("INDEX_STALE", f"index.json was written at {at}, HEAD is {head}, and no daemon "
                            "is running (a clean stop leaves it at HEAD; the next start-up catches it up)",
                            sha=head)]
        if not isinstance(at, str) or at.encode() not in git.store:
            return [RepoFinding("INDEX_STALE", f"index.json names commit {at}, which is not in the repo", sha=head)]
        behind = _commits_behind(git, at, head)
        how = f"{behind} commits behind HEAD" if behind is not None else f"at {at[:12]}, not an ancestor of HEAD"
        out.append(RepoFinding("INDEX_BEHIND", f"index.json is {how}; the running daemon writes it when accepts "
                           "pause", severity="warning", sha=at))
    if _strip(current) != _strip(_rebuild(git, at if at != head else head)):
        where = "HEAD" if at == head else f"its commit {at}"
        return out + [RepoFinding("INDEX_STALE", f"index.json differs from a full rebuild at {where}", sha=at)]
    if at == head and state.index_head not in (None, head):
        out.append(RepoFinding("INDEX_STALE", f"the log's last index.updated was at {state.index_head}, HEAD is "
                           f"{head}", severity="warning", sha=head))
    return out


def _commits_behind(git, older: str, head: str) -> int | None:
    """How many first-parent commits lead from ``older`` to ``head`` (None: not an ancestor)."""
    for count, info in enumerate(git.log(head)):
        if info.sha == older:
            return count
    return None


def _rebuild(git, commit: str) -> dict:
    """A full index document of ``commit`` (from the worktree when it is checked out there)."""
    mark = git.git_dir / WORKTREE_MARK
    tree = git.tree_of(commit).decode()
    if mark.exists() and mark.read_text().strip() == tree:
        return indexer.build(git.root, commit)
    tmp = Path(tempfile.mkdtemp(prefix="kz-audit-"))
    try:
        for path, _mode, blob in git.walk_files("", commit):
            target = tmp / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(git.store[blob].as_raw_string())
        return indexer.build(tmp, commit)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

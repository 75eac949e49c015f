"""Result handling and the accept saga (the two-commit model).

``report_result`` checks that the result comes from the lease holder of the job in
flight, stores it under ``runs/<uuid>/``, applies the server-side hard checks
(``kz_runner.contract.checks``) with the METAS read from the submission, and emits
``result.reported`` together with ``accept.started`` or ``submission.rejected`` in
one append. Nothing touches git on a rejection.

The saga (:func:`run_saga`) is a sequence of idempotent steps keyed by the
submission uuid; each step first looks at what already happened (the fold of the
log, then the commit trailers in git) and does only what is missing:

1. commit 1 (source): the kernel folder is replaced wholesale by the submission's
   files, keeping ``.kernel_package/bench_result.yaml`` as it was, and, unless the
   submission is a maintainer's harness change, HEAD's locked harness files (desc.yaml,
   build_test_env.py, benchmark.py: the ones the runner ran); trailers
   ``Kz-Submission/Kz-Submitter/Kz-Runner/Kz-Step: source`` → ``accept.source_committed``
2. commit 2 (scorecard): only bench_result.yaml, rewritten by ``scorecard`` and
   stamped with SHA_src; subject ``bench_result update (source <SHA_src[:7]>)``
   → ``accept.scorecard_committed``
3. index.json updated for the kernel (``index.updated``) → ``accept.completed``

The scorecard is a pure function of (the scorecard in commit 1's tree, result.json,
submitter, the ts of ``accept.started``), so a restarted saga rebuilds the same
bytes. :func:`finish_saga` runs the saga and, when it cannot finish, rolls it back
(nothing of it in git) or leaves it for a retry (the lease reaper, the next
start-up). ``KZ_CRASH_AT=<point>`` kills the process with SIGKILL at that point (the
crash tests' fault injection); see ``CRASH_POINTS``.
"""
from __future__ import annotations

import hashlib
import os
import signal
from collections.abc import Mapping

import yaml
from dulwich.file import FileLocked

from kz_daemon.board import outcome, ranking
from kz_daemon.config.ports import Daemon
from kz_daemon.core import scorecard
from kz_daemon.core.errors import ZooError
from kz_daemon.core.readmodel import SubmissionView, view_of
from kz_daemon.core.verdicts import BenchmarkResult, CaseSummaryDoc, Verdict
from kz_daemon.guards import physics, unconfined
from kz_daemon.guards.harness_lock import SHORT_SHA, blob_sha
from kz_daemon.guards.harness_review import UNREVIEWED, HarnessDigests, review_of
from kz_daemon.queue import confirm, reruns
from kz_daemon.queue.leases import check_lease
from kz_daemon.storage import anchor
from kz_daemon.storage.gitstore import EXEC_MODE, FILE_MODE, Change, format_message
from kz_daemon.storage.pending import StoredRun, result_bytes
from kz_events import events as ev
from kz_events.durable import FULL_ERRNOS
from kz_events.log.store import StorageError
from kz_events.state import Submission
from kz_events.status import Status
from kz_runner.contract.checks import check_result, unencodable_paths
from kz_runner.contract.indexing import build as index_lib
from kz_runner.contract.layout import BENCH_RESULT, BENCHMARK, DESC, HARNESS_FILES, KP
from kz_runner.contract.tarball import scan_tarball

CRASH_POINTS = (
    "after_result_reported", "before_source_commit", "before_source_ref", "after_source_commit",
    "after_source_event", "before_scorecard_ref", "after_scorecard_commit", "after_scorecard_event",
    "after_index", "after_completed",
)
#: statuses a submission can have because of the result reported under its last lease
REPORTED_STATUSES = (Status.ACCEPTING, Status.ACCEPTED, Status.REJECTED, Status.FAILED)


def crash_point(name: str) -> None:
    """Fault injection: SIGKILL this process when ``KZ_CRASH_AT`` names ``name``."""
    if os.environ.get("KZ_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


# -- results -------------------------------------------------------------------------
def case_summary(result: BenchmarkResult | None, metas: list[dict]) -> list[CaseSummaryDoc]:
    """Per case a ``CaseSummaryDoc`` for result.reported: {test_case_id, correctness, accept,
    primary_metric, value, unit, direction, n, lo, hi} (unit and direction of the primary
    metric from METAS; n, lo, hi its spread when the run reported one).

    Empty for a result holding text UTF-8 cannot encode (the hard checks call it BAD_OUTPUT):
    none of it may reach the event log, which could not write it.
    """
    if unencodable_paths(result):
        return []
    primary = {m.get("test_case_id"): m.get("primary_metric") for m in metas or []}
    declared = {(m.get("test_case_id"), d.get("name")): d for m in metas or []
                for d in _list(m.get("metrics")) if isinstance(d, dict)}
    out: list[CaseSummaryDoc] = []
    # "cases" that is not a list (null, a number, an object) is the hard checks' RESULT_SCHEMA: no summaries
    listed = _list(result.get("cases")) if isinstance(result, dict) else []
    for case in listed:
        if not isinstance(case, dict):
            continue
        cid = case.get("test_case_id")
        if isinstance(cid, (list, dict)):  # not an id (RESULT_SCHEMA): named by its text, like the checks do
            cid = repr(cid)
        metric = primary.get(cid)
        value, spread = None, None
        for m in case.get("metrics", []) if isinstance(case.get("metrics"), list) else []:
            if isinstance(m, dict) and m.get("name") == metric:
                value, spread = m.get("value"), m.get("spread")
        if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
            value = None
        meta = declared.get((cid, metric), {})
        n, lo, hi = _spread_of(spread)
        out.append(CaseSummaryDoc(test_case_id=str(cid), correctness=str(case.get("correctness")),
                               accept=bool(case.get("accept")), primary_metric=metric,
                               value=value if isinstance(value, (int, float)) and not isinstance(value, bool) else None,
                               unit=meta.get("unit"), direction=meta.get("direction"), n=n, lo=lo, hi=hi))
    return out


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _spread_of(spread: object) -> tuple[int | None, float | None, float | None]:
    """A metric's spread as a case summary's n, lo, hi (None where the run reported none)."""
    spread = spread if isinstance(spread, dict) else {}
    n, lo, hi = spread.get("n"), spread.get("lo"), spread.get("hi")
    finite = [v for v in (lo, hi) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
              and abs(v) != float("inf")]
    if type(n) is not int or len(finite) != 2:
        return None, None, None
    return n, finite[0], finite[1]  # as reported (an int stays an int in the log)


def judge(sub: Submission, result: BenchmarkResult | None, failure: dict | None, metas: list[dict]) -> Verdict:
    """The :class:`Verdict` of a reported result: pure (``metas`` from intake)."""
    if failure:
        code = str(failure.get("code") or "RUNNER_FAILURE")
        return Verdict.rejecting(code, str(failure.get("message") or code), {"failure": failure})
    if result is None:
        return Verdict.rejecting("BAD_OUTPUT", "the runner reported no result document")
    case_ids = [str(m.get("test_case_id")) for m in metas]
    checked = check_result(result, kernel_id=sub.kernel_id, case_ids=case_ids)
    if checked.accepted:
        return Verdict.accepting(checked.reason)
    details = {"problems": [p.to_json() for p in checked.problems]}
    code = checked.problems[0].code if checked.problems else "PACKAGE_REJECTED"
    # the reason's message says what is wrong; its code is beside it (checked.reason starts with the code)
    message = checked.problems[0].message if checked.problems else checked.reason
    return Verdict.rejecting(code, message, details, checked.invalid)


def verdict_of(zoo: Daemon, sub: Submission, result: BenchmarkResult | None, failure: dict | None, metas: list[dict],
               facts: dict | None = None) -> Verdict:
    """``judge`` and then the physics floor: the one verdict of a live report and of a start-up re-judge.

    A result that accepts but has a figure no device of the arch can reach becomes
    IMPLAUSIBLE_RESULT, and one with a case nothing bounds NO_FLOOR
    (``kz_daemon.guards.physics``). ``facts`` is the submission record when the caller
    already read it (read from the pending store otherwise).
    """
    verdict = judge(sub, result, failure, metas)
    if not verdict.accepted:
        return verdict
    if facts is None:
        facts = zoo.pending.read_submission(sub.uuid)
    refused = physics.check_result(result, metas, facts.get("io_signature"), sub.arch or "", zoo.config.physics)
    if refused is None:
        return verdict
    return Verdict.rejecting(refused.code, refused.message, refused.details)


def report_result(zoo: Daemon, sub_uuid: str, runner_id: str, lease_id: str, result: dict | None,
                  logs: bytes, env: dict, failure: dict | None) -> SubmissionView:
    """Take a runner's report: hard checks, then the accept saga or a rejection; returns the view.

    Idempotent by (uuid, lease_id): a runner retries a report whose answer it lost, so
    the same report again (same runner and lease, same result bytes) after it was taken
    answers with the current view; one with another result is a CONFLICT. The report of
    a rerun (``kz_daemon.queue.reruns``) is only stored and compared, never judged for an
    accept; the answer is the record's view.
    """
    if reruns.is_rerun(zoo, sub_uuid):
        done = reruns.report(zoo, sub_uuid, runner_id, lease_id, result, logs, env, failure)
        return zoo.submission(done["uuid"])
    with zoo.lock:
        repeat = repeated_report(zoo, sub_uuid, runner_id, lease_id, result)
        if repeat is not None:
            return repeat
        sub, _lease = check_lease(zoo, sub_uuid, runner_id, lease_id)
        confirming = confirm.is_confirmation_run(sub)
        run = confirm.store_run(zoo.pending, sub, result, logs, env, failure)
        facts = zoo.pending.read_submission(sub_uuid)  # read once per report
        metas = facts.get("metas") or []
        accepted, code, message, details, invalid = unconfined.refuse(
            verdict_of(zoo, sub, result, failure, metas, facts), env)  # a run without a sandbox never accepts
        overall = result.get("overall", {}) if isinstance(result, dict) else {}
        overall = overall if isinstance(overall, dict) else {}
        reported = ev.ResultReported(
            uuid=sub_uuid, runner_id=runner_id, lease_id=lease_id, result_sha256=run.sha256,
            overall_accept=accepted, build_ok=overall.get("build_ok") is True,
            cases=case_summary(result, metas), env=env or {})
        # accept.started, a confirmation run (far ahead of the best) or a rejection
        follow = confirm.verdict_events(zoo, sub, run, reported.cases, metas,
                                        Verdict(accepted, code, message, details, invalid), runner_id, lease_id,
                                        confirming, case_summary)
        zoo.store.emit(reported, *follow)
        accepted = isinstance(follow[0], ev.AcceptStarted)
    crash_point("after_result_reported")
    if accepted:  # after a confirmation the saga reads the run it commits from the stored pair
        finish_saga(zoo, sub_uuid, None if confirming else run, metas)
    view = zoo.submission(sub_uuid)
    if invalid:
        raise ZooError("RESULT_INVALID", message, {"uuid": sub_uuid, **details})
    return view


def repeated_report(zoo: Daemon, sub_uuid: str, runner_id: str, lease_id: str,
                    result: dict | None) -> SubmissionView | None:
    """The view when this report was already taken for this lease (None: not a repeat).

    A repeat is a report from the runner and lease whose ``result.reported`` moved the
    submission on (accepting, then accepted or failed; or rejected), or the first run's
    report once a confirmation run was asked for (whatever the status since: queued,
    the confirmation run's lease, or its outcome). Its result must hash to the recorded
    ``result_sha256``, else ZooError CONFLICT: one lease, one result. Reports of any
    other lease or runner fall through to ``check_lease`` (LEASE_LOST).
    """
    with zoo.store.lock:
        state = zoo.store.state
        sub = zoo.store.submission(sub_uuid)  # finished ones from the history projection
        if sub is None or sub.result is None:
            return None
        first = sub.result.get("confirmation")  # the first run's runner, lease and result hash
        if first is not None and (first["runner_id"], first["lease_id"]) == (runner_id, lease_id):
            recorded = first["result_sha256"]
        elif sub_uuid in state.queue.in_flight or sub.status not in REPORTED_STATUSES \
                or sub.runner_id != runner_id or sub.lease_id != lease_id:
            return None
        else:
            recorded = sub.result["result_sha256"]
        view = view_of(sub, state.seq)
    if hashlib.sha256(result_bytes(result)).hexdigest() != recorded:
        raise ZooError("CONFLICT", f"a different result was already reported for submission {sub_uuid} "
                       f"under lease {lease_id} (result sha256 {recorded}); one lease takes one result",
                       {"uuid": sub_uuid, "status": view.status, "result_sha256": recorded})
    return view


# -- the saga --------------------------------------------------------------------------
def submission_files(zoo: Daemon, sub_uuid: str, kernel_id: str) -> dict[str, tuple[bytes, int]]:
    """The submission's files, relative to the package root: {rel: (bytes, git mode)}."""
    limits = zoo.config.limits
    scan = scan_tarball(zoo.pending.package(sub_uuid), limits.contract_limits, capture=lambda n: True,
                        capture_bytes=limits.max_member_bytes)
    if not scan.ok:
        raise ZooError("VALIDATION_ERROR", "the stored package no longer passes the tarball checks",
                       {"problems": [p.to_json() for p in scan.problems]})
    prefix = kernel_id + "/"
    files = {}
    for member in scan.members:
        if member.kind == "file" and member.name.startswith(prefix):
            mode = EXEC_MODE if member.mode & 0o111 else FILE_MODE
            files[member.name[len(prefix):]] = (scan.captured.get(member.name, b""), mode)
    return files


def locked_harness(zoo: Daemon, kernel_id: str, head: str | None) -> dict[str, tuple[bytes, int]]:
    """{name: (bytes, git mode)} of the kernel's harness files at ``head`` (empty for a new kernel).

    Commit 1 of a submission that is not a maintainer's harness change keeps these, so a
    harness change that landed while the job waited is not undone. A pure function of
    ``head`` (commit 1's parent): a retried saga computes the same tree.
    """
    if head is None:
        return {}
    folder = f"{kernel_id}/{KP}"
    out: dict[str, tuple[bytes, int]] = {}
    for path, mode, _blob in zoo.git.walk_files(folder, head):
        name = path[len(folder) + 1:]
        data = zoo.git.read_file(path, head) if name in HARNESS_FILES else None
        if data is not None:
            out[name] = (data, mode)
    return out


def missing_reference_sources(files: Mapping[str, tuple[bytes, int]]) -> list[str] | None:
    """The desc.yaml reference_sources absent from ``files`` (None when desc.yaml is unreadable)."""
    raw = files.get(f"{KP}/{DESC}")
    try:
        desc = scorecard.load(raw[0]) if raw else None
    except yaml.YAMLError:
        desc = None  # unreadable: the validator already refused such packages at intake
    if not isinstance(desc, dict):
        return None
    missing = []
    for ref in desc.get("reference_sources") or []:
        ref = str(ref).strip("/")
        if ref not in files and not any(path.startswith(ref + "/") for path in files):
            missing.append(ref)
    return missing


def _accept_ts(sub: Submission) -> str:
    for _seq, status, ts in reversed(sub.history):
        if status == Status.ACCEPTING:
            return ts[:19] + "Z"
    return sub.received_at[:19] + "Z"


def _trailers(sub: Submission, step: str, **extra: str) -> dict[str, str]:
    out = {"Kz-Submission": sub.uuid, "Kz-Submitter": sub.submitter_id,
           "Kz-Runner": sub.runner_id or "unknown", "Kz-Step": step}
    out.update(extra)
    return out


def new_scorecard(zoo: Daemon, sub: Submission, sha_src: str, result: BenchmarkResult, metas: list[dict]) -> bytes:
    """Commit 2's bench_result.yaml bytes: the rewrite of the card in commit 1's tree, stamped with SHA_src.

    Every record the run writes carries the short blob sha of commit 1's benchmark.py:
    the harness it was measured under (a pure function of SHA_src, so a restarted saga
    writes the same bytes).
    """
    kid = sub.kernel_id
    old = scorecard.load(zoo.git.read_file(f"{kid}/{KP}/{BENCH_RESULT}", sha_src))
    bench = zoo.git.read_file(f"{kid}/{KP}/{BENCHMARK}", sha_src)
    harness = blob_sha(bench)[:SHORT_SHA] if bench is not None else None
    card = scorecard.update_scorecard(old, kid, metas, result, sub.submitter_id, _accept_ts(sub), harness)
    return scorecard.dump(scorecard.stamp(card, sha_src))


def accept_outcome(zoo: Daemon, kernel_id: str, sha_src: str, sha_br: str, metas: list[dict],
                   index_doc: dict | None) -> dict | None:
    """What the accept changed (``kz_daemon.board.outcome``), for ``accept.completed``; None when unreadable.

    The card before is commit 1's (the one the run was judged against), the card after
    commit 2's; the ranks come from the operator's index entries, this kernel's already
    updated. A pure function of git and the index at this point of the saga, so a saga
    finished after a restart records the same outcome.
    """
    path = f"{kernel_id}/{KP}/{BENCH_RESULT}"
    try:
        before = scorecard.load(zoo.git.read_file(path, sha_src))
        after = scorecard.load(zoo.git.read_file(path, sha_br))
    except yaml.YAMLError:
        return None
    kernels = (index_doc or {}).get("kernels") or []
    # The operator's kernels share the first four segments of their kernel_id (intake refuses a
    # category that differs from them): the document is sorted by kernel_id, so they are found by bisection.
    prefix = "/".join(kernel_id.split("/")[:4]) + "/"
    entries = index_lib.with_prefix(kernels, prefix)
    own = next((e for e in entries if e.get("kernel_id") == kernel_id), None)
    operator = ranking.operator_of(own) if own is not None else prefix[:-1]
    # The operator's other kernels whose harness no maintainer reviewed do not rank (as on the board), so
    # this accept's recorded rank does not count them. This kernel's own outcome is recorded unmarked: the
    # status document applies its review when read, so an approval later lets it count as the best it was.
    head = (index_doc or {}).get("head")
    digests = HarnessDigests(zoo.config.paths.repo)
    peers = [dict(e, harness=UNREVIEWED) if e.get("kernel_id") != kernel_id
             and review_of(zoo.store, digests, str(e.get("kernel_id")), head) == UNREVIEWED else e
             for e in entries if ranking.operator_of(e) == operator]
    return outcome.accept_outcome(kernel_id, before, after, metas, peers)


def finish_saga(zoo: Daemon, sub_uuid: str, run: StoredRun | None = None,
                metas: list[dict] | None = None) -> str:
    """Drive an ``accepting`` saga to its end: 'finished', 'rolled_back' (nothing of it in git), or 'pending'.

    'pending' means part of it reached git but the rest failed, or a full disk
    (:func:`storage_trouble`) stopped it: it stays ``accepting`` and is retried (by the
    lease reaper, and at the next start-up), stale git locks removed first. ``run`` and ``metas``
    are what the caller already holds (a report); without them the saga reads them from
    the pending store.

    The attempt and the judgement of its failure happen under one hold of ``git_lock``:
    the reaper's retry of the same saga cannot run in between and meet the lock file a
    failed write left (it would take it for a permanent error and roll the saga back).
    """
    stalls = getattr(zoo, "saga_stalls", None)  # the reaper retries every second: log with backoff
    with zoo.git_lock:
        try:
            run_saga(zoo, sub_uuid, run, metas)
            if stalls is not None:
                stalls.finished(sub_uuid)
            return "finished"
        except Exception as exc:
            transient = storage_trouble(exc) or isinstance(exc, EarlierSagaPending)
            current = zoo.store.submission(sub_uuid)
            if current is None or current.status != Status.ACCEPTING:
                if stalls is not None:
                    stalls.finished(sub_uuid)
                return "finished"
            if transient:  # a failed dulwich write may leave its .lock; it would refuse the retry
                zoo.git.clear_stale_locks()
            in_git = zoo.git.find_commits("Kz-Submission", sub_uuid, since=current.base_head)
            if not transient and not in_git and current.sha_src is None:
                # the exception goes to the operator (stderr, the event); the status shows a fixed text
                zoo.log(f"accept saga of {sub_uuid} rolled back: {type(exc).__name__}: {exc}")
                why = f"saga could not finish: {type(exc).__name__}: {exc}"[:500]
                zoo.store.emit(ev.AcceptRolledBack(  # text the log can write, whatever the exception held
                    uuid=sub_uuid, reason=why.encode("utf-8", "backslashreplace").decode("utf-8")))
                return "rolled_back"
            message = f"accept saga of {sub_uuid} stopped half-way ({type(exc).__name__}: {exc}); retrying later"
    if stalls is not None:
        stalls.failed(sub_uuid, message)
    else:
        zoo.log(message)
    return "pending"


def storage_trouble(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a storage failure that freeing space cures.

    A full disk or quota (ENOSPC, EDQUOT) under the repo's git writes, the event
    store's ``StorageError``, or a git lock file such a failed write left behind
    (dulwich's ``FileLocked``: only the daemon writes its repo, under ``git_lock``, so
    a lock met there is stale): the saga stays ``accepting`` and is retried; only a
    permanent error (the package gone, a conflict) rolls it back.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (StorageError, FileLocked)):
            return True
        if isinstance(current, OSError) and current.errno in FULL_ERRNOS:
            return True
        current = current.__cause__ or current.__context__
    return False


class EarlierSagaPending(Exception):
    """Another accept's saga is half-way in git (its source commit at HEAD) and could not finish yet."""


def finish_earlier_saga(zoo: Daemon, sub_uuid: str) -> None:
    """Finish the saga whose source commit is HEAD, if any, before ``sub_uuid`` commits on top of it.

    A saga stopped after its source commit while the daemon kept serving (its event could
    not be written on a full disk) leaves the branch at that commit. Another accept that
    committed on top would leave the first saga's scorecard commit nowhere to go: it must
    follow its source commit. Raises :class:`EarlierSagaPending` when the earlier saga
    cannot finish; the caller's saga then waits too (it is retried, never rolled back).
    """
    head = zoo.git.head()
    if head is None:
        return
    trailers = zoo.git.commit_info(head).trailers
    other = trailers.get("Kz-Submission")
    if trailers.get("Kz-Step") != "source" or other in (None, sub_uuid):
        return
    sub = zoo.store.state.submissions.get(other)
    if sub is None or sub.status != Status.ACCEPTING:
        return
    try:
        run_saga(zoo, other)
    except Exception as exc:
        raise EarlierSagaPending(f"the accept of {other} is half-way in git and could not finish "
                                 f"({type(exc).__name__}: {exc})") from exc


def run_saga(zoo: Daemon, sub_uuid: str, run: StoredRun | None = None, metas: list[dict] | None = None) -> None:
    """Drive the accept saga of ``sub_uuid`` (status ``accepting``) to a terminal status; idempotent."""
    def result() -> BenchmarkResult:
        doc = run.result if run is not None else \
            confirm.committed_result(zoo.pending, sub_uuid, case_metas(), case_summary)
        if doc is None:  # the verdict accepted a document: only a damaged runs/ folder gets here
            raise ValueError(f"the stored result of {sub_uuid} is empty")
        return doc

    def case_metas() -> list[dict]:
        return metas if metas is not None else zoo.pending.metas(sub_uuid)

    with zoo.git_lock:
        sub = zoo.store.state.submissions.get(sub_uuid)  # only the saga changes an accepting submission
        if sub is None or sub.status != Status.ACCEPTING:  # finished: no longer in the State
            return
        kid = sub.kernel_id
        author = zoo.config.repo.author
        trail = zoo.git.find_commits("Kz-Submission", sub_uuid, since=sub.base_head)
        steps = {c.trailers.get("Kz-Step"): c.sha for c in trail}

        sha_src = sub.sha_src or steps.get("source")
        if sha_src is None:
            crash_point("before_source_commit")
            finish_earlier_saga(zoo, sub_uuid)
            head = zoo.git.head()
            files = submission_files(zoo, sub_uuid, kid)
            if not sub.harness_change:  # the locked harness: HEAD's, as the runner ran it
                files.update({f"{KP}/{name}": content
                              for name, content in locked_harness(zoo, kid, head).items()})
            missing = missing_reference_sources(files)
            if missing:
                zoo.store.emit(ev.SubmissionRejected(
                    uuid=sub_uuid, stage="accept", code="REFERENCE_SOURCE_MISSING",
                    message=f"desc.yaml reference_sources not in the package: {', '.join(missing)}",
                    details={"missing": missing}))
                return
            changes: dict[str, Change] = {kid: None}
            for rel, content in files.items():
                changes[f"{kid}/{rel}"] = content
            old_card = zoo.git.read_file(f"{kid}/{KP}/{BENCH_RESULT}", head) if head else None
            if old_card is not None:
                changes[f"{kid}/{KP}/{BENCH_RESULT}"] = old_card
            overall = result().get("overall")  # an object: the hard checks accepted the document
            reason = str((overall if isinstance(overall, dict) else {}).get("accept_reason") or "")
            message = format_message(f"accept {kid} (submission {sub_uuid[:8]})",
                                     _trailers(sub, "source", **anchor.head_of(zoo)),
                                     body=reason)
            sha_src = zoo.git.commit_changes(changes, message, author, head,
                                             before_ref_update=lambda: crash_point("before_source_ref"))
            crash_point("after_source_commit")
        if sub.sha_src is None:
            parent = zoo.git.commit_info(sha_src).parents
            zoo.store.emit(ev.AcceptSourceCommitted(uuid=sub_uuid, sha_src=sha_src,
                                                    parent=parent[0] if parent else None))
            crash_point("after_source_event")

        sub = zoo.store.state.submissions[sub_uuid]
        sha_br = sub.sha_br or steps.get("scorecard")
        if sha_br is None:
            data = new_scorecard(zoo, sub, sha_src, result(), case_metas())
            message = format_message(f"bench_result update (source {sha_src[:7]})",
                                     _trailers(sub, "scorecard", **{"Kz-Source": sha_src}, **anchor.head_of(zoo)))
            sha_br = zoo.git.commit_changes({f"{kid}/{KP}/{BENCH_RESULT}": data}, message, author, sha_src,
                                            before_ref_update=lambda: crash_point("before_scorecard_ref"))
            crash_point("after_scorecard_commit")
        if sub.sha_br is None:
            zoo.store.emit(ev.AcceptScorecardCommitted(uuid=sub_uuid, sha_src=sha_src, sha_br=sha_br))
            crash_point("after_scorecard_event")

        index_doc = zoo.indexer.update([kid])
        crash_point("after_index")
        zoo.store.emit(ev.AcceptCompleted(uuid=sub_uuid, sha_src=sha_src, sha_br=sha_br,
                                          outcome=accept_outcome(zoo, kid, sha_src, sha_br, case_metas(), index_doc)))
        crash_point("after_completed")
    zoo.after_accept(sha_br)

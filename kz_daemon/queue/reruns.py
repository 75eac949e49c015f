"""Reruns: an accepted record measured again, from its package and harness at its commit, never committed.

``kz rerun UUID`` (``POST /api/submissions/{uuid}/rerun``) asks for one. A rerun is a job
of its own kind: it waits in ``state.reruns`` (``kz_events.reducer``'s rerun handlers),
a runner of the record's arch claims it the way it claims a submission (the claim
takes whichever of the two waited longer, ``leases.claim``), holds it under a lease it
renews and releases through the same runner endpoints, fetches its package and reports
its result to ``/api/submissions/{rerun_id}/result``. The package is the record's kernel
folder at its source commit, exactly what the record's run was given: the submission's
files with the harness the runner ran and the scorecard it was judged against. Nothing of
a rerun reaches git or the scorecard: its report is stored beside the record's run
(``runs/<uuid>/rerun-<rerun_id>-*``) and put beside the record's figures, case by case
(``kz_daemon.board.outcome.rerun_deltas``), with the environment facts that changed.

An admin may cancel a rerun (``kz rerun cancel ID``, ``POST /api/reruns/{id}/cancel``):
a queued one ends ``cancelled`` at once and no runner claims it; a running one goes
``cancelling``: its runner runs the job to its end (the lease stays renewable, so a
runner is never cut off mid-step), and its report is stored as any rerun's but its
figures are discarded and the rerun ends ``cancelled`` (as it does when that lease is
released or expires: never queued again). ``kz rerun list`` (``GET /api/reruns``) shows
where each stands. Every step is an event; these functions only decide them, under
``zoo.lock``.
"""
from __future__ import annotations

import copy
import hashlib
import time
import uuid as uuidlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from kz_daemon.board import outcome
from kz_daemon.config.ports import Daemon
from kz_daemon.core import hints, scorecard, short_ids
from kz_daemon.core.errors import ZooError
from kz_daemon.core.readmodel import SubmissionView
from kz_daemon.guards import unconfined
from kz_daemon.storage.pending import result_bytes
from kz_events import events as ev
from kz_events.durable import atomic_write
from kz_events.reducer import RERUN_LEASED, RERUN_LIVE, RERUN_STATUSES, next_rerun
from kz_events.state import State
from kz_events.status import Status
from kz_runner.contract.checks import check_result
from kz_runner.contract.layout import BENCH_RESULT, BENCHMARK, KP
from kz_runner.contract.rules.pysource import read_metas
from kz_runner.contract.targz import deterministic_targz

__all__ = ["request", "is_rerun", "pick", "claim_event", "decide_renew", "decide_release", "expired", "package",
           "report", "cancel", "listing", "public", "of_record", "get", "wait"]

#: the result-check codes that void a rerun's figures (the package's own verdict does not matter here)
#: ``queue.renew``: (zoo, job id, runner_id, lease_id) -> the lease's new expiry
Renew = Callable[[Daemon, str, str, str], float]
VOID_CODES = frozenset({"BAD_OUTPUT", "RESULT_SCHEMA", "RESULT_KERNEL_ID", "RESULT_CASES", "RESULT_NONFINITE",
                        "BUILD_FAILED"})


def _prefix(rerun_id: str) -> str:
    return f"rerun-{rerun_id}-"


def request(zoo: Daemon, token: str, by: str, runner: str | None = None) -> str:
    """Queue a rerun of the accepted record ``token`` names (a uuid or an unambiguous prefix); its id."""
    with zoo.lock:
        with zoo.store.lock:
            uuid = short_ids.resolve(token, short_ids.records(zoo.store.state), "accepted record")
        view = zoo.submission(uuid)
        if view.status != Status.ACCEPTED:
            raise ZooError("CONFLICT", f"submission {uuid} is {view.status}; only an accepted record can be rerun",
                           {"uuid": uuid, "status": view.status})
        if not view.commit_sha or not view.arch:
            raise ZooError("CONFLICT", f"record {uuid} names no source commit or arch to rerun", {"uuid": uuid})
        rerun_id = str(uuidlib.uuid4())
        zoo.store.emit(ev.RerunRequested(rerun_id=rerun_id, uuid=uuid, kernel_id=view.kernel_id, arch=view.arch,
                                         runner=runner or None, by=by))
    return rerun_id


def is_rerun(zoo: Daemon, job_id: str) -> bool:
    """Whether ``job_id`` names a rerun (rerun ids and submission uuids are both uuid4s: never the same)."""
    with zoo.store.lock:
        return job_id in zoo.store.state.reruns


def pick(state: State, runner_id: str, arch: str) -> tuple[str, int] | None:
    """``(rerun_id, requested seq)`` of the rerun ``runner_id`` would claim next, or None."""
    rerun_id = next_rerun(state, arch, runner_id)
    return (rerun_id, state.reruns[rerun_id]["requested_seq"]) if rerun_id is not None else None


def claim_event(state: State, rerun_id: str, runner_id: str, lease_id: str,
                expires: float) -> tuple[ev.RerunClaimed, str, int]:
    """The claim of a picked rerun: ``(event, kernel_id, attempt)``."""
    rerun = state.reruns[rerun_id]
    attempt = rerun["attempts"] + 1
    return (ev.RerunClaimed(rerun_id=rerun_id, uuid=rerun["uuid"], runner_id=runner_id, lease_id=lease_id,
                            lease_expires_at=expires, attempt=attempt), rerun["kernel_id"], attempt)


def _held(zoo: Daemon, rerun_id: str, runner_id: str, lease_id: str | None) -> dict:
    """A copy of the rerun if ``runner_id`` holds its lease (``lease_id``, any when None); else NOT_FOUND/LEASE_LOST."""
    with zoo.store.lock:
        found = zoo.store.state.reruns.get(rerun_id)
        rerun = copy.deepcopy(found) if found is not None else None
    if rerun is None:
        raise ZooError("NOT_FOUND", f"no rerun {rerun_id}", {"rerun_id": rerun_id})
    lease = rerun["lease"]
    if rerun["status"] not in RERUN_LEASED or lease is None or lease[0] != runner_id or \
            (lease_id is not None and lease[1] != lease_id):
        raise ZooError("LEASE_LOST", f"runner {runner_id} holds no lease on rerun {rerun_id} "
                       f"({rerun['status']}); abandon the job", {"rerun_id": rerun_id, "status": rerun["status"]})
    return rerun


def decide_renew(zoo: Daemon, rerun_id: str, runner_id: str, lease_id: str) -> tuple[float, Any]:
    """Extend the rerun's lease: ``(new expiry, ticket)`` (``leases.decide_renew`` for a rerun)."""
    with zoo.lock:
        rerun = _held(zoo, rerun_id, runner_id, lease_id)
        expires = float(zoo.clock()) + zoo.config.queue.lease_seconds
        return expires, zoo.store.submit(ev.RerunLeaseRenewed(rerun_id=rerun_id, uuid=rerun["uuid"],
                                                              runner_id=runner_id, lease_id=lease_id,
                                                              lease_expires_at=expires))


def _gone(zoo: Daemon, rerun: dict, runner_id: str, lease_id: str, reason: str, expired_: bool) -> list:
    """The events of a lease that ended without a report: back in line, failed once attempts are spent,
    or (a cancelling rerun) cancelled."""
    out: list = [ev.RerunReleased(rerun_id=rerun["rerun_id"], uuid=rerun["uuid"], runner_id=runner_id,
                                  lease_id=lease_id, reason=reason, expired=expired_)]
    if rerun["status"] == "running" and rerun["attempts"] >= zoo.config.queue.max_attempts:
        out.append(ev.RerunFailed(rerun_id=rerun["rerun_id"], uuid=rerun["uuid"], code="ATTEMPTS_EXHAUSTED",
                                  message=hints.exhausted_message(
                                      rerun["attempts"], zoo.config.queue.max_attempts,
                                      hints.lease_expired(runner_id) if expired_ else reason)))
    return out


def decide_release(zoo: Daemon, rerun_id: str, runner_id: str, lease_id: str, reason: str) -> tuple[None, Any]:
    """The runner gives the rerun back: ``(None, ticket)`` (``leases.decide_release`` for a rerun)."""
    with zoo.lock:
        rerun = _held(zoo, rerun_id, runner_id, lease_id)
        return None, zoo.store.submit(*_gone(zoo, rerun, runner_id, lease_id, reason or "released", False))


def expired(zoo: Daemon, state: State, now: float) -> list[list]:
    """The events of every rerun lease past its time, one batch per rerun (the reaper emits them)."""
    return [_gone(zoo, rerun, rerun["lease"][0], rerun["lease"][1], "the lease expired", True)
            for rerun in state.reruns.values()
            if rerun["status"] in RERUN_LEASED and rerun["lease"] is not None and rerun["lease"][2] <= now]


def _record(zoo: Daemon, rerun: dict) -> SubmissionView:
    return zoo.submission(rerun["uuid"])


def package(zoo: Daemon, rerun_id: str, runner_id: str, renew: Renew) -> Path:
    """The tar.gz of the record's kernel folder at its source commit, for the lease holder.

    That folder is what the record's run was given (the submission's files, the harness
    the runner ran, the scorecard it was judged against). Fetching it confirms the claim:
    ``renew(zoo, rerun_id, runner_id, lease_id)`` extends the lease to its full length.
    """
    rerun = _held(zoo, rerun_id, runner_id, None)
    try:
        renew(zoo, rerun_id, runner_id, rerun["lease"][1])
    except ZooError:
        pass  # lost meanwhile: the runner's next call says so
    record = _record(zoo, rerun)
    kid = rerun["kernel_id"]
    entries: dict[str, tuple[str, int, bytes]] = {}
    with zoo.git_lock:
        for path, mode, _blob in zoo.git.walk_files(kid, record.commit_sha):
            data = zoo.git.read_file(path, record.commit_sha) or b""
            entries[path] = ("file", 0o755 if mode & 0o111 else 0o644, data)
    if not entries:
        raise ZooError("CONFLICT", f"the record's source commit {record.commit_sha} holds no {kid}",
                       {"rerun_id": rerun_id})
    target = zoo.pending.run_folder(rerun["uuid"]) / f"{_prefix(rerun_id)}package.tar.gz"
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, deterministic_targz(entries), fsync=False)  # rebuilt from git whenever asked
    return target


def _record_facts(zoo: Daemon, rerun: dict) -> tuple[list[dict], Any, dict]:
    """``(METAS, the record's scorecard, the record's run environment)``, read from git and the run folder."""
    record = _record(zoo, rerun)
    kid = rerun["kernel_id"]
    with zoo.git_lock:
        bench = zoo.git.read_file(f"{kid}/{KP}/{BENCHMARK}", record.commit_sha)
        card = zoo.git.read_file(f"{kid}/{KP}/{BENCH_RESULT}", record.sha_br) if record.sha_br else None
    metas = (read_metas(bench)[0] or []) if bench is not None else []
    try:
        doc = scorecard.load(card)
    except Exception:  # an unreadable scorecard: the figures are left without a comparison
        doc = None
    return [m for m in metas if isinstance(m, dict)], doc, zoo.pending.load_env(rerun["uuid"])


def report(zoo: Daemon, rerun_id: str, runner_id: str, lease_id: str, result: dict | None, logs: bytes,
           env: dict, failure: dict | None) -> dict:
    """Take a rerun's report: stored beside the record's run, its figures put beside the record's; the rerun.

    Idempotent by lease: the same report again after it was taken answers with the
    rerun; another result under the same lease is CONFLICT.
    """
    with zoo.lock:
        with zoo.store.lock:
            found = zoo.store.state.reruns.get(rerun_id)
            rerun = copy.deepcopy(found) if found is not None else None
        done = rerun.get("result") if rerun is not None else None
        if done is not None and (done["runner_id"], done["lease_id"]) == (runner_id, lease_id):
            if hashlib.sha256(result_bytes(result)).hexdigest() != done["result_sha256"]:
                raise ZooError("CONFLICT", f"a different result was already reported for rerun {rerun_id} under "
                               f"lease {lease_id}", {"rerun_id": rerun_id})
            assert rerun is not None  # done came from it
            return public(rerun)
        rerun = _held(zoo, rerun_id, runner_id, lease_id)
        stored = zoo.pending.store_run(rerun["uuid"], result, logs, env, failure, _prefix(rerun_id))
        base = {"rerun_id": rerun_id, "uuid": rerun["uuid"]}
        if rerun["status"] == "cancelling":  # cancelled while it ran: taken, stored, its figures discarded
            event: ev.Event = ev.RerunReported(**base, runner_id=runner_id, lease_id=lease_id,
                                               result_sha256=stored.sha256, cases=[], overall={}, env=env or {},
                                               env_changes=[])
        elif failure:
            code = str(failure.get("code") or "RUNNER_FAILURE")
            event = ev.RerunFailed(**base, code=code, message=str(failure.get("message") or code)[:2000])
        elif not isinstance(stored.result, dict):
            event = ev.RerunFailed(**base, code="BAD_OUTPUT", message="the runner reported no result document")
        elif unconfined.is_unconfined(env):
            event = ev.RerunFailed(**base, code=unconfined.CODE, message="the rerun ran without the runner's "
                                   "sandbox; its figures stand for nothing")
        else:
            metas, card, original_env = _record_facts(zoo, rerun)
            # cast: an accepted record's METAS passed the METAS check, so every test_case_id is a str
            verdict = check_result(stored.result, kernel_id=rerun["kernel_id"],
                                   case_ids=cast(list[str], [m.get("test_case_id") for m in metas]))
            void = [p for p in verdict.problems if p.code in VOID_CODES]
            if void:
                event = ev.RerunFailed(**base, code=void[0].code, message=void[0].message[:2000])
            else:
                cases, overall = outcome.rerun_deltas(card, stored.result, metas)
                event = ev.RerunReported(**base, runner_id=runner_id, lease_id=lease_id,
                                         result_sha256=stored.sha256, cases=cases, overall=overall, env=env or {},
                                         env_changes=outcome.env_changes(original_env, env))
        zoo.store.emit(event)  # either ends the lease
    return get(zoo, rerun_id)


def _resolve(state: State, token: str) -> str:
    """The rerun id ``token`` names: a full id, or an unambiguous prefix of one (as ``kz`` prints: 8 characters)."""
    return short_ids.resolve(token, state.reruns, "rerun")


def cancel(zoo: Daemon, token: str, by: str, reason: str = "") -> dict[str, Any]:
    """Cancel the rerun ``token`` names (an id or an unambiguous prefix); the rerun as it stands after.

    A queued rerun ends ``cancelled``; a running one goes ``cancelling`` (its runner
    finishes, its figures are discarded). Cancelling one that is cancelling or cancelled
    already records nothing new; a done or failed one is CONFLICT.
    """
    with zoo.lock:
        with zoo.store.lock:
            rerun_id = _resolve(zoo.store.state, token)
            found = zoo.store.state.reruns.get(rerun_id)
            rerun = copy.deepcopy(found) if found is not None else None
        if rerun is None:
            raise ZooError("NOT_FOUND", f"no rerun {rerun_id}", {"rerun_id": rerun_id})
        if rerun["status"] in ("done", "failed"):
            raise ZooError("CONFLICT", f"rerun {rerun_id} is {rerun['status']}; only a queued or running rerun can "
                           "be cancelled", {"rerun_id": rerun_id, "status": rerun["status"]})
        if rerun["status"] in ("queued", "running"):
            zoo.store.emit(ev.RerunCancelled(rerun_id=rerun_id, uuid=rerun["uuid"], by=by, reason=reason[:2000]))
    return get(zoo, rerun_id)


def listing(zoo: Daemon, status: str | None = None, uuid: str | None = None,
            kernel_id: str | None = None) -> list[dict[str, Any]]:
    """Every rerun, newest first, as the API shows them; only those of ``status``, record ``uuid``, ``kernel_id``."""
    if status is not None and status not in RERUN_STATUSES:
        raise ZooError("BAD_REQUEST", f"status must be one of {', '.join(RERUN_STATUSES)}, got {status!r}",
                       {"parameter": "status", "allowed": list(RERUN_STATUSES)})
    with zoo.store.lock:
        found = [r for r in zoo.store.state.reruns.values()
                 if (status is None or r["status"] == status) and (uuid is None or r["uuid"] == uuid)
                 and (kernel_id is None or r["kernel_id"] == kernel_id)]
        return [public(r) for r in sorted(found, key=lambda r: r["requested_seq"], reverse=True)]


def public(rerun: dict) -> dict[str, Any]:
    """A rerun as the API shows it: who asked, where it stands, and its figures beside the record's."""
    result = rerun.get("result") or {}
    lease = rerun.get("lease")
    return {"rerun_id": rerun["rerun_id"], "uuid": rerun["uuid"], "kernel_id": rerun["kernel_id"],
            "arch": rerun["arch"], "runner": rerun["runner"], "by": rerun["by"], "status": rerun["status"],
            "terminal": rerun["status"] not in RERUN_LIVE, "requested_at": rerun["requested_at"],
            "attempts": rerun["attempts"], "runner_id": result.get("runner_id") or (lease[0] if lease else None),
            "cases": result.get("cases") or [], "overall": result.get("overall"),
            "env_changes": result.get("env_changes") or [], "reason": rerun.get("reason"),
            "discarded": bool(result.get("discarded")),
            "history": [list(h) for h in rerun["history"]]}


def of_record(state: State, uuid: str) -> list[dict[str, Any]]:
    """The reruns of a record, oldest first, as the API shows them (call under ``store.lock``)."""
    found = [r for r in state.reruns.values() if r["uuid"] == uuid]
    return [public(r) for r in sorted(found, key=lambda r: r["requested_seq"])]


def get(zoo: Daemon, rerun_id: str) -> dict[str, Any]:
    """One rerun as the API shows it; NOT_FOUND for an unknown id."""
    with zoo.store.lock:
        rerun = zoo.store.state.reruns.get(rerun_id)
        if rerun is None:
            raise ZooError("NOT_FOUND", f"no rerun {rerun_id}", {"rerun_id": rerun_id})
        return public(rerun)


def wait(zoo: Daemon, rerun_id: str, timeout_s: float) -> dict[str, Any]:
    """The rerun once it changed or ended, or as it is after ``timeout_s`` (a long poll's slice)."""
    before = get(zoo, rerun_id)
    if before["terminal"] or timeout_s <= 0:
        return before
    deadline = time.monotonic() + timeout_s
    seq = zoo.store.seq
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return get(zoo, rerun_id)
        seq = zoo.store.wait_for_change(seq, remaining)
        now = get(zoo, rerun_id)
        if now["history"] != before["history"] or now["status"] != before["status"]:
            return now

"""The job queue: claims under leases, renewals, releases, the lease reaper, cancels.

Which job a runner gets is the reducer's pure ``next_claimable`` (arch match, at
most one job per kernel_id in flight, round-robin across kernels); this module
only turns decisions into events, under the zoo's decision lock so that a check
and its event are one step (the events are folded there; their fsync is waited for
after the lock is released, so concurrent decisions share one). Every status change
is an event: there is no queue state here besides the fold of the log.

The tarball a runner receives (:func:`runner_package`) is the submission plus the
kernel's current ``.kernel_package/bench_result.yaml`` at HEAD, or a seed scorecard
with the ``0000000`` sentinel for a new kernel_id, built deterministically (sorted
members, zero mtimes and owners) and cached per scorecard blob; a confirmation run's also
carries the operator's reference kernel (:mod:`kz_daemon.queue.reference`).
"""
from __future__ import annotations

import hashlib
import json
import time
import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kz_daemon.config.ports import Daemon
from kz_daemon.config.settings import DaemonLimits
from kz_daemon.core import hints, scorecard
from kz_daemon.core.errors import ZooError
from kz_daemon.guards import harness_lock, harness_review
from kz_daemon.guards.harness_review import HarnessDigests
from kz_daemon.queue import confirm, reference, reruns
from kz_daemon.storage.gitstore import GitStore
from kz_daemon.storage.pending import RUNNER_TARBALL, RUNNER_TARBALL_KEY
from kz_events import events as ev
from kz_events.durable import atomic_write
from kz_events.reducer import next_claimable
from kz_events.state import Submission
from kz_events.status import Status
from kz_runner.contract.layout import BENCH_RESULT, DESC, KP, REFERENCE_DIR
from kz_runner.contract.tarball import scan_tarball
from kz_runner.contract.targz import deterministic_targz


@dataclass(frozen=True)
class LeaseGrant:
    """What a runner gets from a successful claim."""

    uuid: str
    kernel_id: str
    lease_id: str
    lease_expires_at: float   # epoch seconds
    lease_seconds: float
    attempt: int
    arch: str
    timeouts: dict


def claim(zoo: Daemon, runner_id: str, arch: str, wait_s: float = 0.0) -> LeaseGrant | None:
    """Give ``runner_id`` the next job of ``arch`` under a new lease, waiting up to ``wait_s``; None if none.

    A job whose package was frozen in the repo after it was queued is rejected
    (PACKAGE_FROZEN) instead of handed out: frozen packages are never claimable.
    """
    deadline = time.monotonic() + max(0.0, wait_s)
    while True:
        with zoo.lock:  # decisions are serialized; lock order: lock -> git_lock -> store.lock
            with zoo.store.lock:  # the state is not folded while we read it
                state = zoo.store.state
                # a confirmation run goes to another runner first (confirm.excluded)
                sub_uuid = next_claimable(state, arch, exclude=confirm.excluded(state, runner_id,
                                                                                float(zoo.clock())))
                seq = state.seq
                sub = state.submissions[sub_uuid] if sub_uuid is not None else None
                kernel_id, attempts, sub_arch = (sub.kernel_id, sub.attempts, sub.arch) if sub else (None, 0, None)
                # a rerun of an accepted record is a job too: whichever of the two waited longer goes first
                picked = reruns.pick(state, runner_id, arch)
                if picked is not None and (sub is None or picked[1] < sub.queued_seq):
                    lease_id = uuidlib.uuid4().hex
                    expires = float(zoo.clock()) + min(zoo.config.queue.lease_seconds,
                                                       zoo.config.queue.claim_confirm_s)
                    claimed, kernel_id, attempt = reruns.claim_event(state, picked[0], runner_id, lease_id, expires)
                    sub_uuid, attempts, sub_arch = picked[0], attempt - 1, arch
                    ticket = zoo.store.submit(claimed)
                    break
            if sub_uuid is not None:
                assert kernel_id is not None  # sub_uuid's submission gave it
                with zoo.git_lock:
                    frozen = is_frozen(zoo.git, kernel_id)
                if frozen:
                    zoo.store.emit(ev.SubmissionRejected(
                        uuid=sub_uuid, stage="intake", code="PACKAGE_FROZEN",
                        message=f"{kernel_id} was frozen in the repo after this submission was queued; "
                                "frozen packages take no submissions", details={"where": "repo"}))
                    continue
                lease_id = uuidlib.uuid4().hex
                # short until the runner confirms it (package fetch or renewal): a claim whose
                # answer was lost (runner stopped mid-poll, connection dropped) is soon queued again
                expires = float(zoo.clock()) + min(zoo.config.queue.lease_seconds, zoo.config.queue.claim_confirm_s)
                ticket = zoo.store.submit(ev.JobClaimed(uuid=sub_uuid, runner_id=runner_id, lease_id=lease_id,
                                                        lease_expires_at=expires, attempt=attempts + 1))
                break
        zoo.note_runner(runner_id, arch)
        remaining = deadline - time.monotonic()
        if remaining <= 0 or zoo.stopping:
            return None
        zoo.store.wait_for_change(seq, min(remaining, 1.0))
    ticket.wait()  # outside zoo.lock: concurrent decisions share one fsync
    zoo.note_runner(runner_id, arch)
    t = zoo.config.timeouts
    return LeaseGrant(sub_uuid, kernel_id, lease_id, expires, zoo.config.queue.lease_seconds,
                 attempts + 1, sub_arch or arch, {"build_s": t.build_s, "benchmark_s": t.benchmark_s})


def is_frozen(git: GitStore, kernel_id: str) -> bool:
    """Whether the package's desc.yaml at HEAD says ``status: frozen``."""
    return scorecard.desc_is_frozen(git.read_file(f"{kernel_id}/{KP}/{DESC}"))


def check_lease(zoo: Daemon, sub_uuid: str, runner_id: str, lease_id: str | None) -> tuple[Any, Any]:
    """The submission if ``runner_id`` holds lease ``lease_id`` on it; else ZooError NOT_FOUND/LEASE_LOST."""
    with zoo.store.lock:
        state = zoo.store.state
        sub = state.submissions.get(sub_uuid)
        lease = state.queue.in_flight.get(sub_uuid)
    if sub is None:  # finished (the history projection), or unknown
        sub = zoo.store.submission(sub_uuid)
    if sub is None:
        raise ZooError("NOT_FOUND", f"no submission {sub_uuid}", {"uuid": sub_uuid})
    if lease is None or lease.runner_id != runner_id or (lease_id is not None and lease.lease_id != lease_id):
        raise ZooError("LEASE_LOST", f"runner {runner_id} holds no lease on {sub_uuid} "
                       f"(status {sub.status}); abandon the job", {"uuid": sub_uuid, "status": sub.status})
    return sub, lease


def renew(zoo: Daemon, sub_uuid: str, runner_id: str, lease_id: str) -> float:
    """Extend the lease; returns the new expiry (epoch seconds). LEASE_LOST when it is gone."""
    return durable(decide_renew(zoo, sub_uuid, runner_id, lease_id))


def durable(decision: tuple) -> Any:
    """The value of a ``decide_*`` function's ``(value, ticket)`` once its events are durable."""
    value, ticket = decision
    ticket.wait()
    return value


# The decide_* functions make a decision and submit its events under zoo.lock, with no
# I/O, and return (value, ticket): the caller waits for the ticket after zoo.lock is
# released (``durable``, or ``Zoo.decide_async`` on the HTTP loop), so that concurrent
# decisions share one fsync instead of queueing behind each other's.
def decide_renew(zoo: Daemon, sub_uuid: str, runner_id: str, lease_id: str) -> tuple[float, Any]:
    """``renew``'s decision: (new expiry, ticket)."""
    if reruns.is_rerun(zoo, sub_uuid):
        return reruns.decide_renew(zoo, sub_uuid, runner_id, lease_id)
    with zoo.lock:
        check_lease(zoo, sub_uuid, runner_id, lease_id)
        expires = float(zoo.clock()) + zoo.config.queue.lease_seconds
        return expires, zoo.store.submit(ev.JobLeaseRenewed(uuid=sub_uuid, runner_id=runner_id,
                                                            lease_id=lease_id, lease_expires_at=expires))


def _exhausted(zoo: Daemon, sub: Any, last: str) -> list:
    if sub.attempts >= zoo.config.queue.max_attempts:
        return [ev.JobFailed(uuid=sub.uuid, code="ATTEMPTS_EXHAUSTED",
                             message=hints.exhausted_message(sub.attempts, zoo.config.queue.max_attempts, last))]
    return []


def release(zoo: Daemon, sub_uuid: str, runner_id: str, lease_id: str, reason: str) -> None:
    """The runner gives the job back: queued again (attempt counted), or failed when attempts are spent."""
    durable(decide_release(zoo, sub_uuid, runner_id, lease_id, reason))


def decide_release(zoo: Daemon, sub_uuid: str, runner_id: str, lease_id: str,
                   reason: str) -> tuple[None, Any]:
    """``release``'s decision: (None, ticket)."""
    if reruns.is_rerun(zoo, sub_uuid):
        return reruns.decide_release(zoo, sub_uuid, runner_id, lease_id, reason)
    with zoo.lock:
        sub, _lease = check_lease(zoo, sub_uuid, runner_id, lease_id)
        return None, zoo.store.submit(ev.JobReleased(uuid=sub_uuid, runner_id=runner_id, lease_id=lease_id,
                                                     reason=reason or "released"),
                                         *_exhausted(zoo, sub, reason or "released"))


def reap(zoo: Daemon, now: float | None = None) -> int:
    """Expire every lease past its time (job.lease_expired, then job.failed when attempts are spent)."""
    now = float(zoo.clock()) if now is None else now
    count = 0
    with zoo.lock, zoo.store.lock:
        state = zoo.store.state
        for sub_uuid, lease in list(state.queue.in_flight.items()):
            if lease.expires_at > now:
                continue
            sub = state.submissions[sub_uuid]
            zoo.store.emit(ev.JobLeaseExpired(uuid=sub_uuid, runner_id=lease.runner_id,
                                              lease_id=lease.lease_id, attempt=lease.attempt),
                           *_exhausted(zoo, sub, hints.lease_expired(lease.runner_id)))
            count += 1
        for events in reruns.expired(zoo, state, now):
            zoo.store.emit(*events)
            count += 1
    return count


def cancel(zoo: Daemon, sub_uuid: str, by: str, reason: str = "cancelled") -> None:
    """Cancel a submission that has not reached its accept saga; CONFLICT once it has."""
    durable(decide_cancel(zoo, sub_uuid, by, reason))


def decide_cancel(zoo: Daemon, sub_uuid: str, by: str, reason: str = "cancelled") -> tuple[None, Any]:
    """``cancel``'s decision: (None, ticket)."""
    with zoo.lock, zoo.store.lock:
        sub = zoo.store.state.submissions.get(sub_uuid) or zoo.store.submission(sub_uuid)
        if sub is None:
            raise ZooError("NOT_FOUND", f"no submission {sub_uuid}", {"uuid": sub_uuid})
        if sub.status not in CANCELLABLE or (sub.status == Status.RUNNING and sub.result is not None):
            raise ZooError("CONFLICT", f"submission {sub_uuid} is {sub.status}; only received, held, queued "
                           "or running submissions can be cancelled", {"status": sub.status})
        return None, zoo.store.submit(ev.JobCancelled(uuid=sub_uuid, by=by, reason=reason))


#: the statuses a submission can be cancelled in (a running one only until its result is reported)
CANCELLABLE = (Status.RECEIVED, Status.HELD, Status.QUEUED, Status.RUNNING)


# -- the runner's tarball -----------------------------------------------------------
def runner_package(zoo: Daemon, sub_uuid: str, runner_id: str) -> Path:
    """The tar.gz the lease holder runs: the submission plus the current (or seed) scorecard.

    Fetching it confirms the claim: the lease is renewed to its full length. A rerun's
    package is the record's kernel folder at its source commit (``reruns.package``).
    """
    if reruns.is_rerun(zoo, sub_uuid):
        return reruns.package(zoo, sub_uuid, runner_id, renew)
    sub, lease = check_lease(zoo, sub_uuid, runner_id, None)
    try:
        renew(zoo, sub_uuid, runner_id, lease.lease_id)  # a runner fetches its package once per claim
    except ZooError:
        pass  # lost meanwhile: the runner's next call says so
    folder = zoo.pending.folder(sub_uuid)
    kid = sub.kernel_id
    with zoo.git_lock:
        current = zoo.git.read_file(f"{kid}/{KP}/{BENCH_RESULT}")
        # an existing kernel runs HEAD's harness, whatever the package holds (a maintainer's
        # own harness change runs as submitted: HEAD still has the old one)
        harness = {} if sub.harness_change else harness_lock.head_harness(zoo.git, kid)
        extra = _reference_entries(zoo, sub, current)
    if current is None:
        metas = zoo.pending.metas(sub_uuid)
        current = scorecard.dump(scorecard.seed_scorecard(kid, metas))
    key = hashlib.sha256(current + b"".join(hashlib.sha256(harness[n]).digest()
                                            for n in sorted(harness))
                         + b"".join(hashlib.sha256(n.encode() + b"\0" + extra[n]).digest()
                                    for n in sorted(extra))).hexdigest()
    target = folder / RUNNER_TARBALL
    key_file = folder / RUNNER_TARBALL_KEY
    try:
        if target.exists() and json.loads(key_file.read_text()).get("scorecard_sha256") == key:
            return target
    except (OSError, ValueError):
        pass
    data = build_runner_tarball(zoo.pending.package(sub_uuid), kid, current, zoo.config.limits, harness, extra)
    # a cache: a crash may lose it (it is rebuilt), never leave it half-written
    atomic_write(target, data, fsync=False)
    key_file.write_text(json.dumps({"scorecard_sha256": key}) + "\n")
    return target


def _reference_entries(zoo: Daemon, sub: Submission, current: bytes | None) -> dict[str, bytes]:
    """The operator's reference kernel, when this run times one (chosen once, kept in pending/).

    A confirmation run carries it; so does a first run that may be confirmed (a first
    record; on the CPU lane any run while its margin and ``cpu_reference_in_first_run`` are on)
    when ``reference.in_first_run``
    says so, so that both runs measure a ratio. Call with the git lock held.
    """
    kid = sub.kernel_id

    def unreviewed() -> frozenset[str]:
        return harness_review.unreviewed_kernels(zoo.store, HarnessDigests(zoo.config.paths.repo), zoo.git.head())

    def decided() -> dict:
        return reference.decide(zoo.pending, zoo.git, sub.uuid, kid, zoo.pending.metas(sub.uuid), unreviewed)

    if confirm.is_confirmation_run(sub):
        return reference.package_entries(zoo.git, kid, decided())
    settings, arch = zoo.config.confirmation, sub.arch or kid.split("/", 1)[0]
    every_run = arch == "cpu" and settings.cpu_reference_in_first_run
    if not (settings.first_records and confirm.first_record(scorecard.load(current))) and \
            not (every_run and settings.margin_for(arch) > 0):
        return {}
    doc = decided()
    return reference.package_entries(zoo.git, kid, doc) if reference.in_first_run(doc, every_run) else {}


def build_runner_tarball(package: Path, kernel_id: str, bench_result: bytes, limits: DaemonLimits,
                         harness: dict[str, bytes] | None = None, extra: dict[str, bytes] | None = None) -> bytes:
    """Deterministic tar.gz bytes: every member of ``package`` plus ``<kid>/.kernel_package/bench_result.yaml``.

    ``harness`` ({contract file name: bytes}, HEAD's) replaces those files of the package. A
    submitted ``.kernel_package/reference/`` never reaches a runner: only the server puts the
    reference kernel there, as ``extra`` ({path in the tarball: bytes}) of a confirmation run.
    """
    scan = scan_tarball(package, limits.contract_limits, capture=lambda name: True,
                        capture_bytes=limits.max_member_bytes)
    if not scan.ok:
        raise ZooError("CONFLICT", f"the stored package of {kernel_id} no longer passes the tarball checks",
                       {"problems": [p.to_json() for p in scan.problems]})
    entries: dict[str, tuple[str, int, bytes]] = {}
    planted = f"{kernel_id}/{KP}/{REFERENCE_DIR}"
    for member in scan.members:
        if member.name == planted or member.name.startswith(planted + "/"):
            continue
        entries[member.name] = (member.kind, member.mode, scan.captured.get(member.name, b""))
    for name, data in (extra or {}).items():
        entries[name] = ("file", 0o644, data)
    bench_path = f"{kernel_id}/{KP}/{BENCH_RESULT}"
    entries[bench_path] = ("file", 0o644, bench_result)
    for name, data in (harness or {}).items():
        entries[f"{kernel_id}/{KP}/{name}"] = ("file", 0o644, data)
    return deterministic_targz(entries)

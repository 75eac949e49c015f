"""The Zoo: the daemon's one service facade (used by the HTTP shim, ``kz daemon``, ``kz up``, tests).

``Zoo(config)`` opens the event store, the kernel repo and the spool; ``start()``
runs recovery, then the threads: the intake (woken by the watchdog observer and
a periodic rescan), the lease reaper, the worktree/index syncer and the mirror
pusher. Every public method is thread-safe: decisions that read the state and
emit an event hold ``zoo.lock``; every git access holds ``zoo.git_lock`` (the
accept saga holds it for its commits). The queue's decisions fold their events
under ``zoo.lock`` and wait for the fsync after releasing it, so concurrent
requests share fsyncs; the HTTP loop runs them through ``decide_async``.

Status comes only from the fold of the event log (``store.state``); this class
keeps no workflow fields of its own (runners seen is a counter for the queue view).
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from kz_daemon.accept import revoke, saga as accept
from kz_daemon.accept.indexer import Indexer
from kz_daemon.config.settings import Config
from kz_daemon.core import short_ids
from kz_daemon.core.backoff import Backoff
from kz_daemon.core.clock import iso_now
from kz_daemon.core.errors import ZooError
from kz_daemon.core.readmodel import SubmissionView, not_yet_seen, view_of
from kz_daemon.guards import harness_lock
from kz_daemon.intake import idempotency, review, spool
from kz_daemon.intake.admit import Intake
from kz_daemon.ops import recovery
from kz_daemon.queue import leases as queue
from kz_daemon.queue.leases import LeaseGrant
from kz_daemon.storage import run_logs as logs_store
from kz_daemon.storage.gitstore import GitStore
from kz_daemon.storage.pending import PendingStore
from kz_daemon.upkeep import prune_rejected as rejected_uploads, prune_runs as retention
from kz_daemon.upkeep.mirror import Mirror
from kz_events import events as ev
from kz_events.log.history import Query
from kz_events.log.store import Store
from kz_events.status import Status
from kz_runner import __version__

logger = logging.getLogger(__name__)

SYNC_QUIET_S = 1.0       # git index sync waits for this long without an accept ...
SYNC_MAX_DELAY_S = 30.0  # ... but no longer than this
SAGA_RETRY_FIRST_S = 1.0   # the reaper retries a stalled saga after this, doubling ...
SAGA_RETRY_MAX_S = 300.0   # ... up to this (a full disk can last; the log line says so once a minute)


class _Known:
    """``uuid in known``: whether the log has the submission, live or finished (``idempotency.Keys``)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __contains__(self, uuid: object) -> bool:
        return isinstance(uuid, str) and self._store.knows(uuid)


class Zoo:
    """The daemon core. ``Zoo(config)``; ``start()``; the API methods; ``stop()``."""

    def __init__(self, config: Config, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        config.ensure_dirs()
        self.spool = spool.SpoolDirs(config.paths.spool)
        self.spool.ensure()
        # Lock order (never take an earlier one while holding a later one):
        #   lock (decisions: read state + emit)  ->  git_lock (every git access)  ->  store.lock
        self.lock = threading.RLock()
        self.git_lock = threading.RLock()
        self.store = Store.open(config.paths.events, clock=clock)
        self.git = GitStore.open_or_init(config.paths.repo, config.repo.branch, config.repo.fsync, clock)
        self.pending = PendingStore(config.paths.pending, config.paths.runs)
        self.intake = Intake(config, self.store, self.git, self.git_lock, lambda: iso_now(clock))
        self.keys = idempotency.Keys()  # Idempotency-Keys reserved between the decision and intake
        # uploads dropped before a restart keep their keys until intake records them
        self.keys.seed(spool.keyed_sidecars(self.spool), clock())
        self.indexer = Indexer(self)
        self.mirror = Mirror(self)
        self.stopping = False
        self._stop = threading.Event()
        self._wake_intake = threading.Event()
        self._wake_sync = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watcher = spool.InboxWatcher(self.spool.inbox, self._wake_intake.set)
        self._runners: dict[str, dict] = {}
        self._runners_lock = threading.Lock()  # innermost: never held while taking another lock
        self._counters = {"claims": 0, "intake_scans": 0}
        self._last_accept = 0.0
        self.saga_stalls = recovery.StallLog(self.log)  # a stalled saga's retries, logged with backoff
        # when the reaper may retry each stalled saga (monotonic: a wall clock step must not stall it)
        self.saga_retry = Backoff(SAGA_RETRY_FIRST_S, SAGA_RETRY_MAX_S, time.monotonic)
        self.loop_trouble = recovery.StallLog(self.log)  # the intake's and reaper's failed passes, likewise
        self.started = False

    # -- life cycle ------------------------------------------------------------------
    def start(self) -> None:
        """Recover (log, git locks, sagas, intake outcomes, expired leases), then start the threads."""
        recovery.recover(self)
        revoke.recover(self)  # revocations a crash left half-way
        self.store.emit(ev.DaemonStarted(version=__version__, pid=os.getpid()))
        self._watcher.start()
        for name, target in (("kz-intake", self._intake_loop), ("kz-reaper", self._reaper_loop),
                             ("kz-sync", self._sync_loop), ("kz-gc", self._gc_loop)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        self.mirror.start()
        self.indexer.start()
        self._wake_intake.set()
        self._wake_sync.set()
        self.started = True

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the threads (finishing the step in progress) and close the store and repo.

        Bounded by ``timeout`` overall for the threads; never raises (whatever is left
        unfinished, start-up recovery completes next time).
        """
        deadline = time.monotonic() + timeout
        left = lambda: max(0.1, deadline - time.monotonic())  # noqa: E731
        self.stopping = True
        self._stop.set()
        self._wake_intake.set()
        self._wake_sync.set()

        def join_threads() -> None:
            for thread in self._threads:
                thread.join(left())

        for name, step in (("watcher", lambda: self._watcher.stop(left())),
                           ("threads", join_threads),
                           ("mirror", lambda: self.mirror.stop(left())),
                           ("index", lambda: self.indexer.stop(left()))):
            try:
                step()
            except Exception as exc:
                logger.warning("stopping %s: %s: %s", name, type(exc).__name__, exc)
        self._threads.clear()
        with self.lock, self.git_lock:
            for name, close in (("event store", self.store.close), ("repo", self.git.close)):
                try:
                    close()
                except Exception as exc:
                    logger.warning("closing the %s: %s: %s", name, type(exc).__name__, exc)

    def _intake_loop(self) -> None:
        period = self.config.intake.rescan_interval_s
        while not self._stop.is_set():
            self._wake_intake.wait(period)
            self._wake_intake.clear()
            if self._stop.is_set():
                break
            try:
                self.scan_inbox()
                self.loop_trouble.finished("intake", "intake scans work again")
            except Exception as exc:  # keep the daemon alive; the next scan retries
                self.loop_trouble.failed("intake", f"intake scan failed: {type(exc).__name__}: {exc}")
                self._stop.wait(1.0)

    def scan_inbox(self) -> int:
        """Decide every file in the spool now (the intake thread calls this; tests may too)."""
        self._counters["intake_scans"] += 1
        return self.intake.scan_once()

    def _reaper_loop(self) -> None:
        while not self._stop.wait(self.config.queue.reaper_interval_s):
            try:
                queue.reap(self)
                self.retry_stuck_sagas()
                self.loop_trouble.finished("reaper", "the lease reaper works again")
            except Exception as exc:  # e.g. a full disk: one line a minute, not one per pass
                self.loop_trouble.failed("reaper", f"lease reaper failed: {type(exc).__name__}: {exc}")

    def retry_stuck_sagas(self) -> list[str]:
        """Retry the sagas stuck ``accepting`` that are due (``saga_retry``); the uuids tried.

        A saga that failed half-way (a full disk, a saga before it) is retried after
        ``compute_backoff`` of its failures in a row: 1 s, doubling up to
        ``SAGA_RETRY_MAX_S``. Before, the reaper retried each one at every pass, several
        times a second for as long as the trouble lasted. A live saga just makes us wait.
        """
        with self.store.lock:
            state = self.store.state
            stuck = [s.uuid for s in state.submissions.values() if s.status == Status.ACCEPTING] \
                if state.status_counts.get(Status.ACCEPTING) else []
        self.saga_retry.keep_only(set(stuck))
        tried = []
        for sub_uuid in stuck:
            if not self.saga_retry.due(sub_uuid):
                continue
            tried.append(sub_uuid)
            if accept.finish_saga(self, sub_uuid) == "pending":
                self.saga_retry.failed(sub_uuid)
            else:
                self.saga_retry.forget(sub_uuid)
        return tried

    def sweep_retention(self, dry_run: bool = False) -> retention.Sweep:
        """Prune finished submissions' files by ``config.retention`` (``kz_daemon.upkeep.prune_runs``); what went."""
        now = self.clock()
        # finished submissions live in the history projection: read page by page
        pages = self.store.history.finished(retention.cutoff_ts(self.config, now))
        swept = retention.sweep_pages(self.config, pages, now, dry_run=dry_run)
        swept.removed.extend(rejected_uploads.sweep(self.config, self.store.knows, now, dry_run))
        return swept

    def _gc_loop(self) -> None:
        # once at start, then every sweep_interval_s; a failed sweep is retried at the next one
        while not self._stop.is_set():
            try:
                swept = self.sweep_retention()
                if swept.count:
                    logger.info("retention: removed %d file(s)/folder(s) of %d submission(s), %d bytes",
                                swept.count, swept.submissions, swept.bytes)
            except Exception as exc:
                logger.warning("retention sweep failed: %s: %s", type(exc).__name__, exc)
            self._stop.wait(self.config.retention.sweep_interval_s)

    def _sync_loop(self) -> None:
        # git's index file costs ~1 s of CPU to rewrite at 50,000 entries: wait for a quiet
        # moment (no accept for SYNC_QUIET_S, at most SYNC_MAX_DELAY_S) so it does not
        # compete with accepts for the GIL.
        while not self._stop.is_set():
            self._wake_sync.wait(30.0)
            self._wake_sync.clear()
            first = time.monotonic()
            while not self._stop.is_set() and time.monotonic() - self._last_accept < SYNC_QUIET_S \
                    and time.monotonic() - first < SYNC_MAX_DELAY_S:
                self._stop.wait(SYNC_QUIET_S / 4)
            if self._stop.is_set():
                break
            try:
                with self.git_lock:
                    self.git.sync_files()
                    self.git.sync_index()
            except Exception as exc:
                logger.warning("worktree sync failed: %s: %s", type(exc).__name__, exc)

    def after_accept(self, head: str) -> None:
        """Wake the background work that follows an accept (worktree/index sync, mirrors)."""
        self._last_accept = time.monotonic()
        self._wake_sync.set()
        self.mirror.notify(head)

    def log(self, message: str) -> None:
        """Tell the operator about trouble: one WARNING line in the daemon's log (stderr under ``kz daemon``/``kz up``)."""
        logger.warning("%s", message)

    # -- intake ---------------------------------------------------------------------------
    def drop_upload(self, fileobj: BinaryIO, meta: dict[str, Any]) -> str:
        """Stream an upload into the inbox (size cap, sidecar first, atomic renames); returns its uuid."""
        meta = dict(meta)
        meta.setdefault("source", "http")
        sub_uuid = spool.drop(self.spool, fileobj, meta, self.config.limits.max_compressed_bytes)
        self._wake_intake.set()
        return sub_uuid

    def reserve_upload(self, submitter: str, key: str, sha256: str) -> idempotency.Decision:
        """Decide an upload carrying an Idempotency-Key (``kz_daemon.intake.idempotency``), before its drop.

        Returns the uuid to drop it as (``fresh``) or the submission the key already names
        (a replay); ZooError CONFLICT when the key named a different package.
        """
        with self.lock:  # one decision per key at a time
            durable = self.store.idempotency(submitter, key)  # live, or finished (history projection)
            return self.keys.decide(durable, _Known(self.store), submitter, key, sha256, self.clock(),
                                    self.config.limits.idempotency_ttl_s)

    def release_upload(self, submitter: str, key: str, sub_uuid: str) -> None:
        """Forget the reservation of an upload whose drop failed."""
        self.keys.release(submitter, key, sub_uuid)

    def wait_intake(self, sub_uuid: str, timeout: float) -> SubmissionView:
        """Wait until the submission is past intake (queued or later, or rejected); its view.

        Stops early when a write to the event log fails meanwhile (a full disk): the
        upload is safe in the spool and intake takes it once a write succeeds, so the
        client is answered now (``received``) rather than after the whole timeout.
        """
        deadline = time.monotonic() + timeout
        failures = self.store.health()["failures"]
        while True:
            view, seq = self._view(sub_uuid)
            if view is not None and view.status != Status.RECEIVED:
                return view
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.store.health()["failures"] != failures:
                return view or not_yet_seen(sub_uuid, seq)
            self._wake_intake.set()
            self.store.wait_for_change(seq, min(remaining, 0.5))

    def submission(self, sub_uuid: str) -> SubmissionView:
        """The current view of a submission; ZooError NOT_FOUND for an unknown uuid."""
        view, seq = self._view(sub_uuid)
        if view is None and self.intake.knows(sub_uuid):  # in the spool, its events not written yet
            return not_yet_seen(sub_uuid, seq)
        if view is None:
            raise ZooError("NOT_FOUND", f"no submission {sub_uuid}", {"uuid": sub_uuid})
        return view

    def _view(self, sub_uuid: str) -> tuple[SubmissionView | None, int]:
        """(the view or None, the seq it was read at): a live one read under ``store.lock``
        (emit folds into it in place), a finished one from the history projection."""
        with self.store.lock:
            seq = self.store.state.seq
            sub = self.store.state.submissions.get(sub_uuid)
            if sub is not None:
                return view_of(sub, seq), seq
        sub = self.store.submission(sub_uuid)
        return (view_of(sub, seq) if sub is not None else None), seq

    def submissions(self, query: Query, before: int | None = None, limit: int = 50) -> list[SubmissionView]:
        """Submissions matching ``query``, newest first, live and finished (``before``: an arrival seq)."""
        seq = self.store.seq
        return [view_of(sub, seq) for sub in self.store.select(query, before, limit)]

    def wait_submission(self, sub_uuid: str, after_seq: int, timeout: float) -> SubmissionView:
        """Long poll: the view once the log moved past ``after_seq`` (or at ``timeout``)."""
        self.submission(sub_uuid)
        self.store.wait_for_change(after_seq, timeout)
        return self.submission(sub_uuid)

    # -- runners ---------------------------------------------------------------------------
    def note_runner(self, runner_id: str, info: dict | str | None = None) -> None:
        """Remember that a runner asked for work (for the queue view)."""
        facts = dict(info) if isinstance(info, dict) else {"arch": info}
        with self._runners_lock:
            entry = self._runners.setdefault(runner_id, {})
            entry.update({k: v for k, v in facts.items() if v is not None})
            entry["last_seen"] = self.clock()

    def claim(self, runner_id: str, arch: str, wait_s: float = 0.0) -> LeaseGrant | None:
        """The next job of ``arch`` under a new lease, waiting up to ``wait_s``; None when none came."""
        got = queue.claim(self, runner_id, arch, wait_s)
        if got is not None:
            self._counters["claims"] += 1
        return got

    def renew(self, sub_uuid: str, runner_id: str, lease_id: str) -> float:
        """Extend a lease; returns the new expiry (epoch s); ZooError LEASE_LOST when gone."""
        return queue.renew(self, sub_uuid, runner_id, lease_id)

    def release(self, sub_uuid: str, runner_id: str, lease_id: str, reason: str = "released") -> None:
        """Give a job back (queued again, attempt counted)."""
        queue.release(self, sub_uuid, runner_id, lease_id, reason)

    def runner_package(self, sub_uuid: str, runner_id: str) -> Path:
        """The tar.gz for the lease holder: the submission plus the current (or seed) scorecard."""
        return queue.runner_package(self, sub_uuid, runner_id)

    def report_result(self, sub_uuid: str, runner_id: str, lease_id: str, result: dict | None,
                      logs: bytes = b"", env: dict | None = None,
                      failure: dict | None = None, log_tails: dict | None = None) -> SubmissionView:
        """Hard checks on the reported result, then the accept saga or a rejection; the final view.

        ``log_tails`` (``logs.clean_tails``) are stored with the run before its events are
        emitted, so the status document that first shows the verdict also shows them;
        only the lease holder's are stored (a stale report falls through to LEASE_LOST).
        """
        folder = self.pending.run_folder(sub_uuid)
        if log_tails or (folder / logs_store.TAILS_FILE).exists():  # none sent: clear an earlier attempt's
            with self.lock:
                try:
                    queue.check_lease(self, sub_uuid, runner_id, lease_id)
                except ZooError:
                    pass  # a repeat or a stale report: accept.report_result answers it
                else:
                    logs_store.store_tails(folder, log_tails or {})
        return accept.report_result(self, sub_uuid, runner_id, lease_id, result, logs, env or {}, failure)

    def cancel(self, sub_uuid: str, by: str, reason: str = "cancelled") -> SubmissionView:
        """Cancel a submission before its accept saga; its view."""
        queue.cancel(self, sub_uuid, by, reason)
        return self.submission(sub_uuid)

    # -- human review and the locked harness ------------------------------------------------------
    def reviews(self) -> list[dict]:
        """Submissions held for an admin's review, with the rules and evidence that hold them."""
        return review.held(self)

    def review(self, sub_uuid: str, decision: str, by: str, reason: str = "") -> SubmissionView:
        """An admin's decision on a held submission (approve: queued; reject: rejected); its view."""
        review.decide(self, sub_uuid, decision, by, reason)
        return self.submission(sub_uuid)

    def note_verified(self, sub_uuid: str, kind: str, principal_id: str) -> None:
        """Record that upload ``sub_uuid`` came with a token of ``(kind, principal_id)`` (maintainer checks)."""
        harness_lock.record_verified(self.config.state_dir, sub_uuid, kind, principal_id)

    def revoke(self, sub_uuid: str, by: str, reason: str) -> SubmissionView:
        """Take an accepted record back (``kz_daemon.accept.revoke``): events, revocation commit, index; its view.

        ``sub_uuid`` may be an unambiguous prefix of an accepted record's uuid (``kz_daemon.core.short_ids``).
        """
        with self.store.lock:
            sub_uuid = short_ids.resolve(sub_uuid, short_ids.records(self.store.state), "accepted record")
        revoke.revoke(self, sub_uuid, by, reason)
        return self.submission(sub_uuid)

    # -- the same decisions for the HTTP loop --------------------------------------------------
    async def renew_async(self, sub_uuid: str, runner_id: str, lease_id: str) -> float:
        """``renew`` for a coroutine (see ``decide_async``)."""
        return await self.decide_async(queue.decide_renew, sub_uuid, runner_id, lease_id)

    async def release_async(self, sub_uuid: str, runner_id: str, lease_id: str,
                            reason: str = "released") -> None:
        """``release`` for a coroutine (see ``decide_async``)."""
        await self.decide_async(queue.decide_release, sub_uuid, runner_id, lease_id, reason)

    async def cancel_async(self, sub_uuid: str, by: str, reason: str = "cancelled") -> None:
        """``queue.cancel`` for a coroutine (see ``decide_async``)."""
        await self.decide_async(queue.decide_cancel, sub_uuid, by, reason)

    async def decide_async(self, decide: Callable[..., tuple[Any, Any]], *args: Any) -> Any:
        """Run ``decide(zoo, *args)`` (a ``queue.decide_*``: state checks and events, no I/O) and
        await the fsync of its events.

        When ``zoo.lock`` and ``store.lock`` are both free the decision runs on the
        loop's own thread (microseconds) and the fsync is awaited, not waited for by
        a thread: many requests then share one fsync with no thread switch each.
        When either lock is held (an accept saga, a snapshot being encoded) it runs
        in a worker thread instead, so the loop never blocks on a lock.
        """
        held = []
        for lock in (self.lock, self.store.lock):  # the documented lock order
            if not lock.acquire(blocking=False):
                break
            held.append(lock)
        try:
            decision = decide(self, *args) if len(held) == 2 else None
        finally:
            for lock in reversed(held):
                lock.release()
        if decision is None:
            decision = await asyncio.to_thread(decide, self, *args)
        value, ticket = decision
        await ticket.wait_async()
        return value

    # -- read models ----------------------------------------------------------------------------
    def index(self) -> dict:
        """The current index.json document."""
        return self.indexer.current()

    def queue_view(self) -> dict:
        """Pending jobs (in arrival order), jobs in flight with their leases, runners seen."""
        with self.store.lock:
            return self._queue_view()

    def _queue_view(self) -> dict:
        state = self.store.state
        subs = state.submissions
        pending = [{"uuid": u, "kernel_id": subs[u].kernel_id, "arch": subs[u].arch,
                    "submitter_id": subs[u].submitter_id, "attempts": subs[u].attempts}
                   for u in state.queue.pending]
        in_flight = [{"uuid": u, "kernel_id": subs[u].kernel_id, "runner_id": lease.runner_id,
                      "lease_expires_at": lease.expires_at, "attempt": lease.attempt}
                     for u, lease in state.queue.in_flight.items()]
        accepting = [{"uuid": s.uuid, "kernel_id": s.kernel_id} for s in subs.values()
                     if s.status == Status.ACCEPTING]
        with self._runners_lock:
            runners = {k: dict(v) for k, v in self._runners.items()}
        live_reruns = [{"rerun_id": r["rerun_id"], "uuid": r["uuid"], "kernel_id": r["kernel_id"], "arch": r["arch"],
                        "runner": r["runner"], "status": r["status"], "attempts": r["attempts"]}
                       for r in state.reruns.values() if r["status"] in ("queued", "running", "cancelling")]
        return {"seq": state.seq, "pending": pending, "in_flight": in_flight, "accepting": accepting,
                "reruns": live_reruns, "runners": runners, "arches": self._arch_counts(pending, runners)}

    def runner_window_s(self) -> float:
        """How recently a runner must have asked for work to count as serving its arch (two lease periods)."""
        return 2.0 * self.config.queue.lease_seconds

    def _live(self, runner: dict, now: float) -> bool:
        return now - float(runner.get("last_seen") or 0.0) <= self.runner_window_s()

    def _arch_counts(self, pending: list[dict], runners: dict[str, dict]) -> dict[str, dict]:
        """Per arch: live runners, runners seen, jobs waiting (for the queue page and its API)."""
        now = self.clock()
        out: dict[str, dict] = {}
        for runner in runners.values():
            entry = out.setdefault(str(runner.get("arch") or ""), {"runners": 0, "runners_seen": 0, "waiting": 0})
            entry["runners_seen"] += 1
            entry["runners"] += self._live(runner, now)
        for job in pending:
            out.setdefault(str(job.get("arch") or ""), {"runners": 0, "runners_seen": 0, "waiting": 0})["waiting"] += 1
        out.pop("", None)
        return dict(sorted(out.items()))

    def queue_warning(self, arch: str | None) -> dict | None:
        """``{code: NO_RUNNER_FOR_ARCH, message}`` when no runner of ``arch`` asked for work lately; else None."""
        if not arch:
            return None
        now = self.clock()
        with self._runners_lock:
            if any(r.get("arch") == arch and self._live(r, now) for r in self._runners.values()):
                return None
        window = self.runner_window_s()
        return {"code": "NO_RUNNER_FOR_ARCH",
                "message": f"no runner for arch {arch} has asked for work in the last {window:.0f} s, so the "
                           f"job waits until one does: start one on a machine of that arch "
                           f"(kz runner --arch {arch}) or ask the operator"}

    def metrics(self) -> dict:
        """Counters and gauges for /metrics."""
        latency = self.store.accept_latency()  # from the history projection: not under store.lock
        with self.store.lock:
            return {**self._metrics(), "accept_latency_seconds": latency}

    def _metrics(self) -> dict:
        state = self.store.state
        return {
            "events_seq": state.seq,
            "submissions_by_status": dict(state.status_counts),
            "queue_pending": len(state.queue.pending),
            "queue_in_flight": len(state.queue.in_flight),
            "index_version": state.index_version,
            "index_kernels": state.index_kernels,
            "claims_total": self._counters["claims"],
            "intake_scans_total": self._counters["intake_scans"],
            "runners_seen": len(self._runners),  # a len() needs no lock
            "mirrors": dict(state.mirrors),
        }

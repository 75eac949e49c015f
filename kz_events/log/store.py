"""The Store: the one writer of an events directory, holding the live State.

::

    store = Store.open(events_dir, clock=time.time)  # lock, torn-tail repair, snapshot + tail replay
    store.state                                      # current State (read-only; see below)
    seqs = store.emit(ev1, ev2, ...)                 # fold (all or nothing), append durably, publish
    seqs = await store.emit_async(ev1, ...)          # the same from a coroutine
    ticket = store.submit(ev1, ...)                  # fold and queue now ...
    ticket.wait() / await ticket.wait_async()        # ... durable later (after releasing a lock)
    store.wait_for_change(after_seq, timeout) -> int # long poll on the durable seq
    store.chain_head() -> (seq, sha256 hex)          # the last durable line, for anchoring elsewhere
    store.health() -> dict                           # ok, broken, last_error {code, message, at}
    store.snapshot()                                 # write a snapshot now
    store.submission(uuid) -> Submission | None      # live, or finished (from the history projection)
    store.select(query, before, limit)               # newest first, live and finished together
    store.close()

``submit`` folds the events into the state under the store's lock, in order; if
the reducer refuses one (``InvalidTransition``) the state is restored and nothing
is queued. The encoded lines are then made durable by group commit: whoever finds
no commit in progress leads one: it writes every line queued so far, fsyncs once,
and wakes the waiters whose lines are now durable. A waiting thread blocks and is
woken, or is promoted to lead the next commit (a lone emitter does its own write).
A waiting coroutine awaits a future; a committer thread leads for coroutines and
resolves all the futures of one event loop with one call, so many coroutines
share an fsync without a thread switch each. ``emit`` is ``submit`` then ``wait``
and returns only after its lines are fsync-ed. ``wait_for_change`` only ever
reports durable seqs.

``store.state`` is mutated in place by ``submit``; a reader that needs a consistent
view of several fields takes ``with store.lock:``. It may include events whose
fsync is still in progress (their ``emit`` has not returned yet); a caller must not
tell anyone outside the process about its events before its ticket is waited for.

Storage errors. When a commit's write or fsync fails (a full disk: ENOSPC,
EDQUOT; or EIO) the log is cut back to its last durable line (the segment
truncated to its durable length, segments begun by the commit removed, the cut
fsynced) and the store carries on:

- every emitter whose lines were not durable yet gets a ``StorageError``
  (``errno``, ``full``): those of the failed commit, and those folded after it,
  whose events rest on the lost ones (each line's ``prev`` is the hash of the
  line before). Nothing that was acknowledged is touched.
- the state is re-derived from the log (newest usable snapshot plus the tail) and
  copied into the same ``State`` object, by whichever comes first: an emitter
  about to raise, or any call that takes ``store.lock`` to fold (an emit, a
  snapshot, close). Until then no new line is queued. So when an emit raises
  ``StorageError`` the state no longer holds its events.
- the next emit writes again; it succeeds as soon as the disk accepts writes.

Why re-derive rather than undo each fold: folding stays what it was on the fast
path (no undo record per event, no copy of the queue per emit), which keeps the
group commit at its speed; the price, a snapshot load and a tail replay (well
under a second for 50,000 events after a snapshot), is paid only after a
failure. The alternative, holding folds back until their write succeeds, would
let two concurrent emitters decide on the same state and would delay the
``InvalidTransition`` an emitter needs now.

``StoreBroken`` is left for what cannot be recovered in-process: the cut back
itself failed (the file's end is unknown), the log could not be read back, or a
bug raised from the write. Then every later call raises and the process should
restart, which replays the log from disk. ``health()`` reports both states.

Finished submissions. The State holds only live submissions; the reducer hands a
finished one to ``state.finished``, and a thread (``kz-events-history``) writes the
hand-offs of durable lines to the history projection (``kz_events.log.history``,
``events/history.sqlite``) soon after their commit, off the emit path. Readers
(``submission``, ``select``, ``knows``, ``idempotency``) look in the State, the
hand-off and the projection in that order, so nothing is ever missing in between.
The projection is brought to the snapshot's seq before a snapshot is written
(snapshots no longer hold finished submissions), and at open the store uses a
snapshot no newer than the projection and hands the tail's finished submissions
over again; a projection that is missing, unreadable or no longer matches the log
is rebuilt by replaying the whole log.
"""
from __future__ import annotations

import asyncio
import dataclasses
import errno
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kz_events.codec import TimestampFormatter, encode_fast, format_ts, line_hash, subject_of
from kz_events.durable import FULL_ERRNOS
from kz_events.events import EVENT_TYPES, Event, LogRepaired
from kz_events.log.history import History, HistoryError, Query, history_path, remove_files
from kz_events.log.reading import merge, received_seq, settle
from kz_events.log.replay import replay_into
from kz_events.log.segments import DEFAULT_SEGMENT_BYTES, EventLog, LogError, Position
from kz_events.log.snapshot import encode_snapshot, load_newest, release_free_memory, write_snapshot
from kz_events.reducer import REDUCER_VERSION, apply_record, checkpoint, restore
from kz_events.state import State, Submission

__all__ = ["Store", "Ticket", "StoreClosed", "StoreBroken", "StorageError", "OpenReport"]

_STATE_FIELDS = tuple(f.name for f in dataclasses.fields(State))
#: the history thread lets hand-offs gather this long after a commit: fewer, larger transactions.
HISTORY_BATCH_S = 0.05


class StoreClosed(RuntimeError):
    """The store was closed."""


class StoreBroken(RuntimeError):
    """The log's end is unknown; the store refuses everything until the process reopens it."""


class StorageError(OSError):
    """A write or fsync of the log failed: these events were not recorded, the store goes on.

    ``errno`` is the failed call's (None when it had none); ``full`` is True when the
    disk or a quota is full (ENOSPC, EDQUOT). The state no longer holds the events,
    and a later emit succeeds once the disk accepts writes again.
    """

    def __init__(self, errno_: int | None, message: str) -> None:
        super().__init__(errno_, message)
        self.full = errno_ in FULL_ERRNOS


class _Waiter:
    """An emitter waiting for its lines: woken to return, or promoted to lead the next commit."""

    __slots__ = ("lock", "last", "lead", "abandoned")

    def __init__(self, last: int) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.last = last          # woken once this seq is durable
        self.lead = False
        self.abandoned = False


class Ticket:
    """Events folded and queued by ``Store.submit``: their seqs, and the wait until they are durable."""

    __slots__ = ("_store", "seqs", "_epoch")

    def __init__(self, store: Store, seqs: list[int], epoch: int) -> None:
        self._store = store
        self.seqs = seqs
        self._epoch = epoch       # which run of commits between two failures queued the lines

    def wait(self) -> list[int]:
        """Block until the lines are durable (joining, or leading, the group commit); the seqs.

        Raises ``StorageError`` when a failed commit took them (or lines they follow).
        """
        if self.seqs:
            try:
                self._store._join_commit(self.seqs[-1], self._epoch)
            except StorageError:
                self._store._settle()  # the state without the lost events before we say so
                raise
            self._store._after_durable(self.seqs[-1])
        return self.seqs

    async def wait_async(self) -> list[int]:
        """``wait`` for a coroutine: awaits a future that the commit's writer resolves."""
        if self.seqs:
            try:
                await self._store._await_commit(self.seqs[-1], self._epoch)
            except StorageError:
                # re-reading the log may take a while: not on the loop's thread
                await asyncio.to_thread(self._store._settle)
                raise
            self._store._after_durable(self.seqs[-1])
        return self.seqs


def _resolve_futures(ready: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future]]) -> None:
    """Resolve futures of durable lines: one call into each loop (from the commit's thread)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future]] = {}
    for _last, loop, future in ready:
        by_loop.setdefault(loop, []).append(future)
    for loop, futures in by_loop.items():
        try:
            loop.call_soon_threadsafe(_set_done, futures)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


def _set_done(futures: list[asyncio.Future]) -> None:
    for future in futures:
        if not future.done():  # a cancelled waiter
            future.set_result(None)


def _drainer(history: History) -> Callable[[State, Position], None]:
    """A replay's drain: write the hand-offs so far to the projection and let go of them."""
    def drain(state: State, pos: Position) -> None:
        finished = state.finished
        assert finished is not None  # replay_into refuses a drain for a state without the hand-off list
        history.apply(finished, pos)
        finished.clear()
    return drain


class OpenReport(dict):
    """What ``Store.open`` did: repair, snapshot used, events replayed, seconds, notes."""


class Store:
    """The live event store of one events directory (see the module docstring)."""

    def __init__(self, log: EventLog, state: State, clock: Callable[[], float], *,
                 snapshot_every: int, snapshot_keep: int, fsync: bool, report: OpenReport,
                 history: History, use_snapshots: bool = True):
        self._log = log
        self._state = state
        self._history = history
        self._history_lock = threading.Lock()   # one drain at a time (thread, snapshot, close)
        self._history_error: str | None = None  # the last failed drain, until one succeeds
        self._history_stop = False
        self._historian: threading.Thread | None = None
        self._clock = clock
        self._format_ts = TimestampFormatter()
        self._fsync = fsync
        self._snapshot_every = snapshot_every
        self._snapshot_keep = snapshot_keep
        self.lock = threading.RLock()          # state and seq assignment
        self._cond = threading.Condition()     # durable seq, broken/closed (long polls wait here)
        self._queue = threading.Lock()         # pending lines, their waiters, who leads
        self._pending: list[tuple[int, bytes, str]] = []
        self._waiters: list[_Waiter] = []      # threads waiting for their lines
        self._futures: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future]] = []  # coroutines
        self._leading = False                  # a group commit is in progress
        self._kick = threading.Semaphore(0)    # wakes the committer thread to lead for coroutines
        self._committer: threading.Thread | None = None
        self._committer_stop = False
        self._hash = log.tail.hash             # hash of the last folded line
        self._durable_seq = state.seq
        self._durable_hash = log.tail.hash     # hash of the last durable line (the chain head)
        self._durable_pos = log.tail           # where that line lies (the projection records it)
        self._broken: BaseException | None = None
        # After a failed commit: the epoch (run of commits) ends, its error is kept for
        # late waiters, and the state must be re-derived (``_stale``) before any fold.
        self._epoch = 0
        self._epoch_ends: dict[int, tuple[int, BaseException]] = {}  # epoch -> (durable seq, error)
        self._stale: BaseException | None = None
        self._use_snapshots = use_snapshots
        self._failures = 0                     # failed commits since open
        self._failing = False                  # the last commit failed
        self._last_error: dict[str, Any] | None = None
        self._closed = False
        self._snapshot_lock = threading.Lock()
        self._snapshotter: threading.Thread | None = None
        self._last_snapshot_seq = report.get("snapshot_seq") or 0
        self.report = report

    # --- opening ------------------------------------------------------------------

    @classmethod
    def open(cls, events_dir: Path | str, clock: Callable[[], float] = time.time, *,
             snapshot_every: int = 50_000, snapshot_keep: int = 2, use_snapshots: bool = True,
             segment_bytes: int = DEFAULT_SEGMENT_BYTES, fsync: bool = True) -> Store:
        """Open (creating if missing) the log in ``events_dir`` for writing.

        Takes the OS lock (``LogLocked`` names the holder's pid), repairs a torn
        tail (then emits ``log.repaired``), loads the newest usable snapshot and
        replays the tail after it (``CorruptLog`` for a damaged line).
        ``snapshot_every``: write a snapshot every N events (0: never by itself).
        ``fsync=False`` is for tests and benchmarks of the CPU path only.
        """
        started = time.perf_counter()
        events_dir = Path(events_dir)
        log = EventLog.open(events_dir, segment_bytes=segment_bytes, fsync=fsync)
        history = None
        try:
            report = OpenReport(repair=None, snapshot_seq=None, replayed=0, notes=[], history=None)
            history = cls._open_history(events_dir, log, fsync, report)
            state, start = State(), None
            if use_snapshots:
                snap_state, snap_pos, notes = load_newest(events_dir, REDUCER_VERSION,
                                                          log.check_position, max_seq=history.seq)
                report["notes"].extend(notes)
                if snap_state is not None:
                    assert snap_pos is not None  # load_newest gives both or neither
                    state, start = snap_state, snap_pos
                    report["snapshot_seq"] = start.seq
            state.finished = []
            drain = _drainer(history)
            report["replayed"] = replay_into(log, state, start, drain=drain)
            drain(state, log.tail)
            report["history"] = {"seq": history.seq, "rebuilt": report["history"]}
            store = cls(log, state, clock, snapshot_every=snapshot_every,
                        snapshot_keep=snapshot_keep, fsync=fsync, report=report,
                        history=history, use_snapshots=use_snapshots)
        except BaseException:
            if history is not None:
                history.close()
            log.close()
            raise
        store._start_historian()
        if log.repair is not None:
            report["repair"] = {"segment": log.repair.segment, "offset": log.repair.offset,
                                "dropped_bytes": log.repair.dropped_bytes,
                                "quarantine_file": log.repair.quarantine_file}
            store.emit(LogRepaired(log.repair.dropped_bytes, log.repair.quarantine_file))
        release_free_memory()  # the snapshot's and the replay's temporaries
        report["seconds"] = time.perf_counter() - started
        return store

    @staticmethod
    def _open_history(events_dir: Path, log: EventLog, fsync: bool, report: OpenReport) -> History:
        """The history projection, recreated empty (rebuilt by the replay) when it cannot serve."""
        path = history_path(events_dir)
        why = None if path.exists() else "missing: built from the log"
        try:
            history = History.open(path, fsync=fsync)
        except HistoryError as exc:
            history, why = None, str(exc)
        if history is not None and history.seq and not log.check_position(history.position):
            why = f"its position (seq {history.seq}) is not in the log"
            history.close()
            history = None
        if history is None:
            if path.exists():
                report["notes"].append(f"{path.name}: {why}; rebuilt from the log")
            remove_files(path)
            history = History.open(path, fsync=fsync)
        report["history"] = why
        return history

    # --- reading ------------------------------------------------------------------

    @property
    def state(self) -> State:
        """The current State (treat as read-only; ``with store.lock:`` for a consistent view)."""
        return self._state

    @property
    def seq(self) -> int:
        """The last durable seq."""
        return self._durable_seq

    @property
    def events_dir(self) -> Path:
        """The directory this store writes."""
        return self._log.dir

    @property
    def history(self) -> History:
        """The history projection of finished submissions (read through ``submission``/``select``)."""
        return self._history

    def submission(self, uuid: str) -> Submission | None:
        """A submission by uuid, live or finished, with every event folded so far; None when unknown.

        A live one is the State's own object (read it under ``store.lock`` for a consistent
        view); a finished one is a record to treat as read-only.
        """
        with self.lock:
            sub = self._state.submissions.get(uuid)
            if sub is not None:
                return sub
            pending = [h for h in self._state.finished or () if h.uuid == uuid]
        return settle(uuid, pending, self._history)

    def knows(self, uuid: str) -> bool:
        """Whether the log has a submission with this uuid (live or finished)."""
        with self.lock:
            state = self._state
            if uuid in state.submissions or state.kernel_of(uuid) is not None or \
                    any(h.uuid == uuid for h in state.finished or ()):
                return True
        return self._history.has(uuid)

    def kernel_records(self, kernel_id: str, statuses: tuple[str, ...]) -> list[Submission]:
        """The finished records of a kernel whose status is one of ``statuses``, in arrival order."""
        with self.lock:
            pending = [h for h in self._state.finished or ()]
        by_uuid: dict[str, list] = {}
        for h in pending:
            by_uuid.setdefault(h.uuid, []).append(h)
        found = {sub.uuid: sub for sub in self._history.records_of_kernel(kernel_id)}
        for uuid, handoffs in by_uuid.items():
            if uuid in found or any(h.record is not None and h.record.kernel_id == kernel_id for h in handoffs):
                sub = settle(uuid, handoffs, self._history)
                if sub is not None:
                    found[uuid] = sub
        return sorted((s for s in found.values() if s.status in statuses), key=received_seq)

    def unknown(self, uuids: list[str]) -> list[str]:
        """Those of ``uuids`` the log has no submission for, in the order given."""
        with self.lock:
            state = self._state
            handed = {h.uuid for h in state.finished or ()}
            rest = [u for u in uuids if u not in state.submissions and state.kernel_of(u) is None
                    and u not in handed]
        stored = self._history.known_among(rest)
        return [u for u in rest if u not in stored]

    def select(self, query: Query, before: int | None = None, limit: int = 50) -> list[Submission]:
        """The newest ``limit`` submissions matching ``query``, live and finished, newest first.

        ``before``: only those received before that seq (``received_seq`` of the last row of
        the previous page).
        """
        with self.lock:
            live = list(self._state.submissions.values())
            pending = list(self._state.finished or ())
        return merge(live, pending, self._history, query, before, limit)

    def idempotency(self, submitter: str, key: str) -> list | None:
        """``[uuid, sha256, received ts]`` of the newest submission that carried this Idempotency-Key."""
        with self.lock:
            state = self._state
            entry = state.idempotency.get(submitter, {}).get(key)
            if entry is not None:
                return list(entry)
            handed = [h.record for h in state.finished or () if h.record is not None
                      and h.record.submitter_id == submitter and h.record.idempotency_key == key]
        if handed:
            sub = max(handed, key=received_seq)
            return [sub.uuid, sub.sha256, sub.received_at]
        return self._history.idempotency(submitter, key)

    def accept_latency(self) -> dict[str, Any]:
        """The received → accepted histogram of the accepted records (``History.accept_latency``),
        with every durable hand-off written first. Call it without holding ``store.lock``."""
        self._drain_history()
        return self._history.accept_latency()

    def flush_history(self) -> int:
        """Write every durable hand-off to the projection now; the projection's seq."""
        self._drain_history()
        return self._history.seq

    def chain_head(self) -> tuple[int, str]:
        """(seq, sha256 hex) of the last durable line: the ``prev`` the next event will carry.

        (0, 64 zeros) for an empty log. A copy of it kept elsewhere (the daemon writes
        it into its git commits) anchors the log: ``kz_events.read.audit.check_anchors``
        later tells whether the log still holds that line.
        """
        with self._cond:
            return self._durable_seq, self._durable_hash

    def health(self) -> dict[str, Any]:
        """How the store stands: ``ok`` is False while broken, closed, or after a failed commit
        until the next commit succeeds.

        ``{"ok", "broken", "closed", "seq" (durable), "failures" (failed commits since open),
        "last_error": None | {"code" (errno name, or the exception's class), "errno",
        "full", "message", "at" (UTC RFC 3339)}}``.
        """
        with self._cond:
            return {
                "ok": self._broken is None and not self._failing and not self._closed,
                "broken": self._broken is not None,
                "closed": self._closed,
                "seq": self._durable_seq,
                "failures": self._failures,
                "last_error": dict(self._last_error) if self._last_error else None,
                "history": {"seq": self._history.seq, "error": self._history_error},
            }

    def wait_for_change(self, after_seq: int, timeout: float) -> int:
        """Block until the durable seq exceeds ``after_seq`` or ``timeout`` s pass; return it."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while self._durable_seq <= after_seq and not self._closed and self._broken is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return self._durable_seq

    # --- writing ------------------------------------------------------------------

    def emit(self, *events: Event) -> list[int]:
        """Fold ``events`` (all or none), append them durably, return their seqs.

        ``submit(*events).wait()``. Raises ``InvalidTransition``/``SequenceGap``
        (nothing written, state unchanged), TypeError/ValueError for something that
        is not a valid event, ``StorageError`` when the write or fsync failed (nothing
        of it kept, state without it, the store still usable), ``StoreClosed``/``StoreBroken``.
        """
        if not events:
            return []
        return self.submit(*events).wait()

    async def emit_async(self, *events: Event) -> list[int]:
        """``emit`` for a coroutine: the loop's thread folds, the durable wait is awaited.

        Many coroutines emitting at once share one fsync, and no thread is woken
        per event: the commit's writer resolves every waiting future of one loop
        with one call. If another thread holds ``store.lock`` (a snapshot being
        encoded, a caller's consistent read) the fold runs in a worker thread
        instead, so the loop never blocks on the lock.
        """
        if not events:
            return []
        if self.lock.acquire(blocking=False):
            try:
                ticket = self.submit(*events)
            finally:
                self.lock.release()
        else:
            ticket = await asyncio.to_thread(self.submit, *events)
        return await ticket.wait_async()

    def submit(self, *events: Event) -> Ticket:
        """Fold ``events`` (all or none) and queue their lines; the lines are not durable yet.

        The caller must ``wait()`` (or ``await ticket.wait_async()``) before telling
        anyone outside the process about them. The split lets a caller make a
        decision and its events one step under its own lock, then wait for the
        fsync after releasing it, so that concurrent decisions share one fsync.
        Raises as ``emit`` does; a ticket of no events is already durable.
        """
        if not events:
            return Ticket(self, [], 0)
        with self.lock:
            self._check_usable()
            records = self._fold(events)
            with self._queue:
                failed = self._stale
                if failed is None:
                    self._pending.extend(records)
                    epoch = self._epoch
            if failed is not None:  # a commit failed meanwhile: this fold rests on lost lines
                self._resync()
                raise self._lost(failed)
        return Ticket(self, [r[0] for r in records], epoch)

    def _fold(self, events: tuple[Event, ...]) -> list[tuple[int, bytes, str]]:
        state = self._state
        for ev in events:
            if not isinstance(ev, Event) or EVENT_TYPES.get(ev.TYPE) is not type(ev):
                raise TypeError(f"not a registered event: {ev!r}")
        memo = checkpoint(state, [ev.payload() for ev in events]) if len(events) > 1 else None
        records: list[tuple[int, bytes, str]] = []
        h = self._hash
        try:
            for ev in events:
                seq = state.seq + 1
                kernel_id = None
                uuid = getattr(ev, "uuid", None)
                if uuid is not None and getattr(ev, "kernel_id", None) is None:
                    kernel_id = state.kernel_of(uuid)
                ts = self._format_ts(self._clock())
                # fold what replay will see: the payload as read back from the line
                line, payload = encode_fast(ev, seq, ts, h, subject_of(ev, kernel_id))
                apply_record(state, seq, ts, ev.TYPE, payload)
                h = line_hash(line)
                records.append((seq, line, h))
        except BaseException:
            if memo is not None:
                restore(state, memo)
            raise
        self._hash = h
        return records

    def _check_usable(self) -> int:
        """Raise when closed or broken; re-derive the state after a failed commit; the epoch.

        Called under ``self.lock``. The epoch returned was read together with the
        state being current, so a commit that fails later is seen by the wait.
        """
        while True:
            if self._closed:
                raise StoreClosed(f"the store of {self._log.dir} is closed")
            if self._broken is not None:
                raise self._broken_error()
            with self._queue:
                if self._stale is None:
                    return self._epoch
            self._resync()

    def _broken_error(self) -> StoreBroken:
        error = StoreBroken(f"the event log {self._log.dir} is in an unknown state after "
                            f"{self._broken!r}; restart to reopen the log")
        error.__cause__ = self._broken
        return error

    def _lost(self, failure: BaseException) -> BaseException:
        """The exception for an emitter whose lines ``failure`` took (a fresh one per raise)."""
        if self._broken is not None or not isinstance(failure, OSError):
            return self._broken_error()
        error = StorageError(failure.errno, f"appending to the event log {self._log.dir} failed: "
                                            f"{failure.strerror or failure}; nothing of it was "
                                            "recorded")
        error.__cause__ = failure
        return error

    def _resync(self) -> None:
        """Re-derive the state from the log after a failed commit (under ``self.lock``).

        No line is queued while ``_stale`` is set, so the log is not written meanwhile.
        """
        with self._queue:
            if self._stale is None:
                return
        try:
            state, start = State(), None
            if self._use_snapshots:
                snap_state, snap_pos, _notes = load_newest(self._log.dir, REDUCER_VERSION,
                                                           self._log.check_position,
                                                           max_seq=self._history.seq)
                if snap_state is not None:
                    state, start = snap_state, snap_pos
            # hand-offs the projection holds already are skipped when it is written
            state.finished = []
            replay_into(self._log, state, start, drain=_drainer(self._history))
            if state.seq != self._durable_seq:
                raise LogError(f"the log reads back to seq {state.seq}, "
                               f"but seq {self._durable_seq} was acknowledged")
        except (OSError, LogError, ValueError) as exc:
            with self._cond:
                self._broken = exc
                self._cond.notify_all()
            raise self._broken_error() from None
        live = self._state  # the same object: callers may hold it
        for name in _STATE_FIELDS:
            setattr(live, name, getattr(state, name))
        self._hash = self._log.tail.hash
        with self._queue:
            self._stale = None

    def _settle(self) -> None:
        """Re-derive the state now if a commit failed (an emitter about to raise calls it)."""
        with self.lock:
            if self._stale is not None and self._broken is None and not self._closed:
                self._resync()

    def _raise_if_lost(self, last: int, epoch: int) -> None:
        """Return when seq ``last`` of ``epoch`` is durable; else raise what took it."""
        # durable first: read before the epoch, it cannot be a later epoch's seq
        durable = self._durable_seq
        if epoch == self._epoch:
            if durable >= last:
                return
            if self._broken is not None:
                raise self._broken_error()
            raise RuntimeError(f"seq {last} is neither durable nor failed")  # a bug in the commit
        end, failure = self._epoch_ends[epoch]
        if last <= end:
            return
        raise self._lost(failure)

    def _join_commit(self, last: int, epoch: int) -> None:
        """Block until seq ``last`` is durable, leading a commit when none is in progress."""
        with self._queue:
            if epoch != self._epoch or self._durable_seq >= last or self._broken is not None:
                waiter = lead = None
            elif self._leading:
                waiter, lead = _Waiter(last), None
                self._waiters.append(waiter)
            else:
                self._leading = True
                waiter, lead = None, True
        if waiter is not None:
            try:
                waiter.lock.acquire()  # released when our lines are durable, or to lead
            except BaseException:  # e.g. KeyboardInterrupt: never leave a commit leaderless
                with self._queue:
                    waiter.abandoned = not waiter.lead
                if waiter.lead:
                    self._lead()
                raise
            lead = waiter.lead
        if lead:
            self._lead()
        self._raise_if_lost(last, epoch)

    async def _await_commit(self, last: int, epoch: int) -> None:
        """``_join_commit`` for a coroutine: the committer thread leads, a future is awaited."""
        loop = asyncio.get_running_loop()
        with self._queue:
            if epoch != self._epoch or self._durable_seq >= last or self._broken is not None:
                future = kick = None
            else:
                future = loop.create_future()
                self._futures.append((last, loop, future))
                kick = not self._leading
                if kick:
                    self._leading = True
                    self._start_committer()
        if kick:
            self._kick.release()
        if future is not None:
            await future  # cancelled: the lines are committed all the same
        self._raise_if_lost(last, epoch)

    def _start_committer(self) -> None:
        """Start the thread that leads commits for coroutines (under ``_queue``; once)."""
        if self._committer is None:
            self._committer = threading.Thread(target=self._commit_loop, name="kz-events-commit",
                                               daemon=True)
            self._committer.start()

    def _commit_loop(self) -> None:
        while True:
            self._kick.acquire()
            if self._committer_stop:
                return
            self._lead()

    def _after_durable(self, last: int) -> None:
        if self._snapshot_every and last - self._last_snapshot_seq >= self._snapshot_every:
            self._periodic_snapshot()

    def _lead(self) -> None:
        """Group commit: write every pending line, fsync once, wake the emitters of those lines.

        Emits that arrive during the fsync queue up as waiters (threads) or
        futures (coroutines). Thread waiters whose lines are durable are woken;
        the first still waiting is promoted to lead the next commit, so a lone
        emitter does its own write. Futures are resolved with one call per loop.
        A failed write is handed to ``_commit_failed`` (the log is already cut back).
        """
        while True:
            with self._queue:
                records, self._pending = self._pending, []
            failure = None
            if records and self._broken is None:
                try:
                    self._log.append(records)
                except BaseException as exc:  # noqa: BLE001 - every emitter of the batch gets it
                    failure = exc
            if failure is not None:
                self._commit_failed(failure)
            with self._cond:
                if records and failure is None and self._broken is None:
                    self._durable_seq = records[-1][0]
                    self._durable_hash = records[-1][2]
                    self._durable_pos = self._log.tail
                    self._failing = False
                self._cond.notify_all()
            durable = self._durable_seq if self._broken is None else float("inf")
            with self._queue:
                done = [w for w in self._waiters if w.last <= durable]
                if done:
                    self._waiters = [w for w in self._waiters if w.last > durable]
                ready = [f for f in self._futures if f[0] <= durable]
                if ready:
                    self._futures = [f for f in self._futures if f[0] > durable]
            for waiter in done:
                waiter.lock.release()
            if ready:
                _resolve_futures(ready)
            with self._queue:
                while self._waiters and self._waiters[0].abandoned:
                    self._waiters.pop(0).lock.release()
                if self._waiters:
                    successor = self._waiters.pop(0)
                    successor.lead = True
                    successor.lock.release()
                    return
                if not self._pending:  # else: lines of coroutines or abandoned waiters
                    self._leading = False
                    return

    def _commit_failed(self, failure: BaseException) -> None:
        """End the epoch: every line not durable is dropped and its emitter woken to raise.

        ``EventLog.append`` has cut the log back to its last durable line; if it could
        not (``RollbackFailed``), or the failure is not an OSError (a bug), the store
        is broken. Lines queued after the failed batch are dropped too: their ``prev``
        is the hash of a line that was not recorded. The state is re-derived by the
        next holder of ``self.lock`` (``_resync``).
        """
        broken = not isinstance(failure, OSError)
        code = (errno.errorcode.get(failure.errno, "EIO") if isinstance(failure, OSError)
                and failure.errno else type(failure).__name__)
        with self._cond:
            if broken:
                self._broken = failure
            self._failures += 1
            self._failing = True
            self._last_error = {
                "code": code, "errno": getattr(failure, "errno", None),
                "full": getattr(failure, "errno", None) in FULL_ERRNOS, "message": str(failure),
                "at": format_ts(self._clock()),
            }
        with self._queue:
            self._epoch_ends[self._epoch] = (self._durable_seq, failure)
            self._epoch += 1
            self._stale = failure
            self._pending = []
            waiters, self._waiters = self._waiters, []
            futures, self._futures = self._futures, []
        for waiter in waiters:  # not promoted: each finds its lines lost and raises
            waiter.lock.release()
        if futures:
            _resolve_futures(futures)

    # --- snapshots ------------------------------------------------------------------

    def snapshot(self) -> Path:
        """Write a snapshot of the current state now; returns its path."""
        with self._snapshot_lock:
            with self.lock:
                epoch = self._check_usable()
                self._join_commit(self._state.seq, epoch)
                pos = self._log.tail
                data = encode_snapshot(self._state, pos, REDUCER_VERSION)
            # the snapshot holds no finished submission: the projection must hold them first
            # (HistoryError: no snapshot now; the next one, or a replay, makes up for it)
            self._drain_history()
            path = write_snapshot(self._log.dir, pos.seq, data, keep=self._snapshot_keep,
                                  fsync=self._fsync)
            self._last_snapshot_seq = pos.seq
            return path

    def _periodic_snapshot(self) -> None:
        """Start a snapshot in the background (the emitter that crossed the mark returns now)."""
        with self._queue:
            if self._snapshotter is not None and self._snapshotter.is_alive():
                return
            self._snapshotter = threading.Thread(target=self._snapshot_quietly,
                                                 name="kz-events-snapshot", daemon=True)
            self._snapshotter.start()

    def _snapshot_quietly(self) -> None:
        try:
            self.snapshot()
        except (StoreClosed, StoreBroken, OSError, HistoryError):
            pass  # a snapshot is a cache: the next one, or a replay, makes up for it

    def position(self) -> Position:
        """Where the last durable event lies in the log (seq, hash, segment, offsets)."""
        with self.lock:
            self._join_commit(self._state.seq, self._check_usable())
            return self._log.tail

    # --- the history projection ------------------------------------------------------

    def _start_historian(self) -> None:
        self._historian = threading.Thread(target=self._history_loop, name="kz-events-history",
                                           daemon=True)
        self._historian.start()

    def _history_loop(self) -> None:
        """Write hand-offs to the projection soon after their lines are durable."""
        while True:
            with self._cond:
                while not self._history_stop and not (self._state.finished and
                                                      self._state.finished[0].seq <= self._durable_seq):
                    self._cond.wait(1.0)
                if self._history_stop:
                    return
            time.sleep(HISTORY_BATCH_S)  # let a burst of commits gather into one transaction
            try:
                self._drain_history()
            except HistoryError:
                with self._cond:  # kept in the hand-off; retried after a pause
                    self._cond.wait(1.0)

    def _drain_history(self) -> None:
        """Apply the hand-offs of durable lines to the projection, then let go of them."""
        with self._history_lock:
            with self._cond:
                pos = self._durable_pos
            with self.lock:
                finished = self._state.finished
                handoffs = [h for h in finished if h.seq <= pos.seq] if finished else []
            if not handoffs and pos.seq <= self._history.seq:
                return
            try:
                self._history.apply(handoffs, pos)
            except HistoryError as exc:
                self._history_error = str(exc)
                raise
            self._history_error = None
            with self.lock:
                finished = self._state.finished
                assert finished is not None  # the store's state always has its hand-off list
                n = 0
                while n < len(finished) and finished[n].seq <= pos.seq:
                    n += 1
                del finished[:n]

    # --- closing ------------------------------------------------------------------

    def close(self) -> None:
        """Flush, release the lock and refuse further calls; idempotent."""
        snapshotter = self._snapshotter
        if snapshotter is not None:
            snapshotter.join()
        with self._cond:  # the history thread first: it takes store.lock to let go of hand-offs
            self._history_stop = True
            self._cond.notify_all()
        if self._historian is not None:
            self._historian.join()
        with self.lock:
            if self._closed:
                return
            if self._broken is None:
                try:
                    self._join_commit(self._state.seq, self._check_usable())
                except (StoreBroken, StorageError):
                    pass  # what was not durable is lost either way; the log holds the rest
                try:
                    self._drain_history()
                except HistoryError:
                    pass  # the next open replays what the projection lacks
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            with self._queue:
                committer, self._committer_stop = self._committer, True
            if committer is not None:
                self._kick.release()
                committer.join()
            self._history.close()
            self._log.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

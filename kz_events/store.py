"""The Store: the one writer of an events directory, holding the live State.

::

    store = Store.open(events_dir, clock=time.time)  # lock, torn-tail repair, snapshot + tail replay
    store.state                                      # current State (read-only; see below)
    seqs = store.emit(ev1, ev2, ...)                 # fold (all or nothing), append durably, publish
    store.wait_for_change(after_seq, timeout) -> int # long poll on the durable seq
    store.snapshot()                                 # write a snapshot now
    store.close()

``emit`` folds the events into the state under the store's lock, in order; if
the reducer refuses one (``InvalidTransition``) the state is restored and nothing
is written. The encoded lines are then made durable by group commit (leader and
followers): an emitter that finds no commit in progress leads one: it writes
every line queued so far, fsyncs once, and wakes exactly the emitters of those
lines; emits arriving meanwhile wait, and the first of them is promoted to lead
the next commit. ``emit`` returns only after its lines are fsync-ed.
``wait_for_change`` only ever reports durable seqs.

``store.state`` is mutated in place by ``emit``; a reader that needs a consistent
view of several fields takes ``with store.lock:``. It may include events whose
fsync is still in progress (they are durable by the time their ``emit`` returns).
If a write or fsync fails the store is broken (``StoreBroken``): every later call
raises and the process should restart, which replays the log from disk.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

from kz_events.codec import TimestampFormatter, encode_fast, line_hash, subject_of
from kz_events.events import EVENT_TYPES, Event, LogRepaired
from kz_events.log import DEFAULT_SEGMENT_BYTES, EventLog, Position
from kz_events.reducer import REDUCER_VERSION, apply_record, checkpoint, restore
from kz_events.replay import replay_into
from kz_events.snapshot import encode_snapshot, load_newest, write_snapshot
from kz_events.state import State

__all__ = ["Store", "StoreClosed", "StoreBroken", "OpenReport"]


class StoreClosed(RuntimeError):
    """The store was closed."""


class StoreBroken(RuntimeError):
    """A write or fsync failed; the store refuses everything until the process reopens it."""


class _Waiter:
    """An emitter waiting for its lines: woken to return, or promoted to lead the next commit."""

    __slots__ = ("lock", "lead", "abandoned")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.lead = False
        self.abandoned = False


class OpenReport(dict):
    """What ``Store.open`` did: repair, snapshot used, events replayed, seconds, notes."""


class Store:
    """The live event store of one events directory (see the module docstring)."""

    def __init__(self, log: EventLog, state: State, clock: Callable[[], float], *,
                 snapshot_every: int, snapshot_keep: int, fsync: bool, report: OpenReport):
        self._log = log
        self._state = state
        self._clock = clock
        self._format_ts = TimestampFormatter()
        self._fsync = fsync
        self._snapshot_every = snapshot_every
        self._snapshot_keep = snapshot_keep
        self.lock = threading.RLock()          # state and seq assignment
        self._cond = threading.Condition()     # durable seq, broken/closed (long polls wait here)
        self._queue = threading.Lock()         # pending lines, their waiters, who leads
        self._pending: list[tuple[int, bytes, str]] = []
        self._waiters: list[_Waiter] = []
        self._leading = False                  # a group commit is in progress
        self._hash = log.tail.hash             # hash of the last folded line
        self._durable_seq = state.seq
        self._broken: BaseException | None = None
        self._closed = False
        self._snapshot_lock = threading.Lock()
        self._snapshotter: threading.Thread | None = None
        self._last_snapshot_seq = report.get("snapshot_seq") or 0
        self.report = report

    # --- opening ------------------------------------------------------------------

    @classmethod
    def open(cls, events_dir: Path | str, clock: Callable[[], float] = time.time, *,
             snapshot_every: int = 50_000, snapshot_keep: int = 2, use_snapshots: bool = True,
             segment_bytes: int = DEFAULT_SEGMENT_BYTES, fsync: bool = True) -> "Store":
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
        try:
            report = OpenReport(repair=None, snapshot_seq=None, replayed=0, notes=[])
            state, start = State(), None
            if use_snapshots:
                snap_state, snap_pos, notes = load_newest(events_dir, REDUCER_VERSION,
                                                          log.check_position)
                report["notes"].extend(notes)
                if snap_state is not None:
                    state, start = snap_state, snap_pos
                    report["snapshot_seq"] = start.seq
            report["replayed"] = replay_into(log, state, start)
            store = cls(log, state, clock, snapshot_every=snapshot_every,
                        snapshot_keep=snapshot_keep, fsync=fsync, report=report)
        except BaseException:
            log.close()
            raise
        if log.repair is not None:
            report["repair"] = {"segment": log.repair.segment, "offset": log.repair.offset,
                                "dropped_bytes": log.repair.dropped_bytes,
                                "quarantine_file": log.repair.quarantine_file}
            store.emit(LogRepaired(log.repair.dropped_bytes, log.repair.quarantine_file))
        report["seconds"] = time.perf_counter() - started
        return store

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

        Raises ``InvalidTransition``/``SequenceGap`` (nothing written, state
        unchanged), TypeError/ValueError for something that is not a valid event,
        ``StoreClosed``/``StoreBroken``.
        """
        if not events:
            return []
        waiter = None
        with self.lock:
            self._check_usable()
            records = self._fold(events)
            with self._queue:
                self._pending.extend(records)
                if self._leading:
                    waiter = _Waiter()
                    self._waiters.append(waiter)
                else:
                    self._leading = True
        if waiter is not None:
            try:
                waiter.lock.acquire()  # released when our lines are durable, or to lead
            except BaseException:  # e.g. KeyboardInterrupt: never leave a commit leaderless
                with self._queue:
                    waiter.abandoned = not waiter.lead
                if waiter.lead:
                    self._lead()
                raise
            if waiter.lead:
                waiter = None
        if waiter is None:
            self._lead()
        if self._broken is not None and self._durable_seq < records[-1][0]:
            raise StoreBroken(f"appending to {self._log.dir} failed: {self._broken!r}; "
                              "restart to reopen the log") from self._broken
        last = records[-1][0]
        if self._snapshot_every and last - self._last_snapshot_seq >= self._snapshot_every:
            self._periodic_snapshot()
        return [r[0] for r in records]

    def append_many(self, events: list[Event]) -> list[int]:
        """``emit(*events)``: one fold, one write, one fsync for the whole batch."""
        return self.emit(*events)

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
                    sub = state.submissions.get(uuid)
                    kernel_id = sub.kernel_id if sub is not None else None
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

    def _check_usable(self) -> None:
        if self._closed:
            raise StoreClosed(f"the store of {self._log.dir} is closed")
        if self._broken is not None:
            raise StoreBroken(f"a write to {self._log.dir} failed earlier: {self._broken!r}; "
                              "restart to reopen the log") from self._broken

    def _lead(self) -> None:
        """Group commit: write every pending line, fsync once, wake the emitters of those lines.

        Emits that arrive during the fsync queue up as waiters; the first of them
        is promoted to lead the next commit, so there is never a writer thread and
        a lone emitter does its own write. After a failed write nothing more is
        written (the file's end is unknown): the store is broken.
        """
        while True:
            with self._queue:
                records, self._pending = self._pending, []
                waiters, self._waiters = self._waiters, []
            if records and self._broken is None:
                try:
                    self._log.append(records)
                except BaseException as exc:  # noqa: BLE001 - every emitter of the batch gets it
                    self._broken = exc
            with self._cond:
                if records and self._broken is None:
                    self._durable_seq = records[-1][0]
                self._cond.notify_all()
            for waiter in waiters:
                waiter.lock.release()
            with self._queue:
                while self._waiters and self._waiters[0].abandoned:
                    self._waiters.pop(0).lock.release()
                if self._waiters:
                    successor = self._waiters.pop(0)
                    successor.lead = True
                    successor.lock.release()
                    return
                if not self._pending:  # else: lines of abandoned waiters, commit them too
                    self._leading = False
                    return

    def _wait_durable(self, target: int) -> None:
        """Block until ``target`` is durable (raises StoreBroken after a failed write)."""
        with self._cond:
            while self._durable_seq < target:
                if self._broken is not None:
                    raise StoreBroken(f"appending to {self._log.dir} failed: {self._broken!r}; "
                                      "restart to reopen the log") from self._broken
                self._cond.wait(1.0)

    # --- snapshots ------------------------------------------------------------------

    def snapshot(self) -> Path:
        """Write a snapshot of the current state now; returns its path."""
        with self._snapshot_lock:
            with self.lock:
                self._check_usable()
                self._wait_durable(self._state.seq)
                pos = self._log.tail
                data = encode_snapshot(self._state, pos, REDUCER_VERSION)
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
        except (StoreClosed, StoreBroken, OSError):
            pass  # a snapshot is a cache: the next one, or a replay, makes up for it

    def position(self) -> Position:
        """Where the last durable event lies in the log (seq, hash, segment, offsets)."""
        with self.lock:
            self._wait_durable(self._state.seq)
            return self._log.tail

    # --- closing ------------------------------------------------------------------

    def close(self) -> None:
        """Flush, release the lock and refuse further calls; idempotent."""
        snapshotter = self._snapshotter
        if snapshotter is not None:
            snapshotter.join()
        with self.lock:
            if self._closed:
                return
            if self._broken is None:
                try:
                    self._wait_durable(self._state.seq)
                except StoreBroken:
                    pass
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            self._log.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
is written. The encoded lines are then made durable by group commit: the first
emitter waiting becomes the leader, writes every line queued so far and fsyncs
once, while the others wait for it (their lines ride along). ``emit`` returns
only after its lines are fsync-ed. ``wait_for_change`` only ever reports durable
seqs.

``store.state`` is mutated in place by ``emit``; a reader that needs a consistent
view of several fields takes ``with store.lock:``. It may include events whose
fsync is still in progress (they are durable by the time their ``emit`` returns).
If a write or fsync fails the store is broken (``StoreBroken``): every later call
raises and the process should restart, which replays the log from disk.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Callable

from kz_events.codec import canonical_bytes, format_ts, line_hash, subject_of
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


class OpenReport(dict):
    """What ``Store.open`` did: repair, snapshot used, events replayed, seconds, notes."""


class Store:
    """The live event store of one events directory (see the module docstring)."""

    def __init__(self, log: EventLog, state: State, clock: Callable[[], float], *,
                 snapshot_every: int, snapshot_keep: int, fsync: bool, report: OpenReport):
        self._log = log
        self._state = state
        self._clock = clock
        self._fsync = fsync
        self._snapshot_every = snapshot_every
        self._snapshot_keep = snapshot_keep
        self.lock = threading.RLock()          # state and seq assignment
        self._pending_lock = threading.Lock()  # the lines waiting for the next leader
        self._cond = threading.Condition()     # durable seq, leader election, broken/closed
        self._pending: list[tuple[int, bytes, str]] = []
        self._hash = log.tail.hash             # hash of the last folded line
        self._durable_seq = state.seq
        self._syncing = False
        self._broken: BaseException | None = None
        self._closed = False
        self._snapshot_lock = threading.Lock()
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
        with self.lock:
            self._check_usable()
            records = self._fold(events)
            with self._pending_lock:
                self._pending.extend(records)
        last = records[-1][0]
        self._wait_durable(last)
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
                ts = format_ts(self._clock())
                envelope = {"seq": seq, "ts": ts, "type": ev.TYPE, "v": ev.VERSION,
                            "subject": subject_of(ev, kernel_id), "payload": ev.payload(),
                            "prev": h}
                line = canonical_bytes(envelope)
                # fold what replay will see: the payload as read back from the line
                payload = json.loads(line)["payload"]
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

    def _wait_durable(self, target: int) -> None:
        """Return once ``target`` is fsync-ed: lead a group commit or wait for the leader."""
        while True:
            with self._cond:
                while True:
                    if self._durable_seq >= target:
                        return
                    if self._broken is not None:
                        self._check_usable()
                    if not self._syncing:
                        self._syncing = True
                        break
                    self._cond.wait()
            with self._pending_lock:
                batch, self._pending = self._pending, []
            try:
                if batch:
                    self._log.append(batch)
            except BaseException as exc:
                with self._cond:
                    self._broken = exc
                    self._syncing = False
                    self._cond.notify_all()
                raise StoreBroken(f"appending to {self._log.dir} failed: {exc!r}") from exc
            with self._cond:
                if batch:
                    self._durable_seq = batch[-1][0]
                self._syncing = False
                self._cond.notify_all()

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
        if not self._snapshot_lock.locked():
            try:
                self.snapshot()
            except (StoreClosed, StoreBroken):
                pass

    def position(self) -> Position:
        """Where the last durable event lies in the log (seq, hash, segment, offsets)."""
        with self.lock:
            self._wait_durable(self._state.seq)
            return self._log.tail

    # --- closing ------------------------------------------------------------------

    def close(self) -> None:
        """Flush, release the lock and refuse further calls; idempotent."""
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

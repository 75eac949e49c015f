"""Reading submissions across the live State, the hand-off and the history projection.

A submission is in exactly one of three places, and a reader looks in that order:
live in the State; finished and handed off (``State.finished``) but not yet stored
by the projection's writer; or stored in the projection. A finished record may also
have later changes waiting in the hand-off (a revocation), which ``settle`` applies
to a copy of the stored record, so a reader sees every folded event at once.

The store (``Store.submission``, ``Store.select``) reads this way inside the daemon.
Tools beside a running daemon read a state directory the same way through
``open_view``: the newest snapshot no newer than the projection, the log's tail with
its hand-offs kept, and the projection opened read-only (or, when there is none, a
full replay that keeps every finished record in memory).
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kz_events.log.history import History, HistoryError, Query, history_path
from kz_events.log.replay import replay_into
from kz_events.log.segments import EventLog, Position
from kz_events.log.snapshot import load_newest
from kz_events.reducer import REDUCER_VERSION, amend
from kz_events.state import Handoff, State, Submission

__all__ = ["received_seq", "settle", "merge", "keep_records", "View", "open_view", "replay_finished",
           "verify_history"]


def received_seq(sub: Submission) -> int:
    """The seq of a submission's ``submission.received``: its place in arrival order."""
    return sub.history[0][0]


def settle(uuid: str, pending: list[Handoff], history: History | None) -> Submission | None:
    """The finished record of ``uuid`` with every change folded so far, or None when unknown.

    ``pending`` are the hand-offs of ``uuid`` not yet known to be stored, in seq order.
    The record is shared with the hand-off unless a change had to be applied (a copy then):
    treat it as read-only.
    """
    base, base_seq = None, 0
    for h in reversed(pending):
        if h.record is not None:
            base, base_seq = h.record, h.seq
            break
    if base is None and history is not None:
        found = history.get(uuid)
        if found is not None:
            base_seq, base = found
    if base is None:
        return None
    changes = [(h.seq, h.change) for h in pending if h.change is not None and h.seq > base_seq]
    if changes:
        base = copy.deepcopy(base)
        for seq, change in changes:
            amend(base, seq, change)
    return base


def merge(live: list[Submission], pending: list[Handoff], history: History | None, query: Query,
          before: int | None, limit: int) -> list[Submission]:
    """The newest ``limit`` submissions matching ``query`` (received before seq ``before``), newest first.

    ``live`` are the State's live submissions and ``pending`` the hand-off, both read
    together (under the store's lock); the projection is read after, so a submission
    that finished in between is found in one of the two.
    """
    found: dict[str, Submission] = {}
    for sub in live:
        if (before is None or received_seq(sub) < before) and query.match(sub):
            found[sub.uuid] = sub
    by_uuid: dict[str, list[Handoff]] = {}
    for h in pending:
        by_uuid.setdefault(h.uuid, []).append(h)
    for uuid, handoffs in by_uuid.items():  # few: what the history thread has not written yet
        if uuid in found:
            continue
        settled = settle(uuid, handoffs, history)
        if settled is not None and (before is None or received_seq(settled) < before) and query.match(settled):
            found[uuid] = settled
    if history is not None:
        # the hand-off's uuids are decided above: skip their rows, and ask for as many more
        for _rseq, sub in history.select(query, before, limit + len(by_uuid)):
            if sub.uuid not in found and sub.uuid not in by_uuid:
                found[sub.uuid] = sub
    return sorted(found.values(), key=received_seq, reverse=True)[:limit]


def keep_records(records: dict[str, Submission],
                 keep: Callable[[Submission], bool] | None = None) -> Callable[[State, Position], None]:
    """A replay's drain that stores each finished record in ``records`` (those ``keep`` accepts).

    Memory grows with the history: for tools and tests over logs that fit in memory,
    and for audits that keep only what they check.
    """
    def drain(state: State, _pos: Position) -> None:
        handoffs = _take(state)
        for h in handoffs:
            if h.record is not None:
                if keep is None or keep(h.record):
                    records[h.uuid] = h.record
            elif h.change is not None and h.uuid in records:
                amend(records[h.uuid], h.seq, h.change)
    return drain


def _take(state: State) -> list[Handoff]:
    """Empty the hand-off of a replay's State (one that keeps it: ``finished`` is a list)."""
    finished = state.finished
    if finished is None:
        raise ValueError("the State keeps no hand-off")
    handoffs = list(finished)
    finished.clear()
    return handoffs


def replay_finished(events_dir: Path | str, keep: Callable[[Submission], bool] | None = None
                    ) -> tuple[State, dict[str, Submission]]:
    """A full replay of a log: the State and every finished record (those ``keep`` accepts) by uuid.

    Read-only and independent of the projection (the audit's view of what the log says).
    """
    records: dict[str, Submission] = {}
    log = EventLog.open(events_dir, readonly=True)
    try:
        state = State(finished=[])
        drain = keep_records(records, keep)
        replay_into(log, state, drain=drain)
        drain(state, log.tail)
        return state, records
    finally:
        log.close()


@dataclass
class View:
    """A read-only view of an events directory: the State plus every finished submission."""

    state: State
    history: History | None                         # the projection, read-only (None: not usable)
    records: dict[str, Submission] = field(default_factory=dict)  # finished ones kept in memory

    def _pending(self, uuid: str) -> list[Handoff]:
        return [h for h in self.state.finished or () if h.uuid == uuid]

    def submission(self, uuid: str) -> Submission | None:
        """A submission, live or finished (None when the log does not know it)."""
        sub = self.state.submissions.get(uuid)
        if sub is not None:
            return sub
        if uuid in self.records:
            return self.records[uuid]
        return settle(uuid, self._pending(uuid), self.history)

    def uuids(self, prefix: str = "", limit: int = 10_000) -> list[str]:
        """Known uuids starting with ``prefix`` (case-insensitive), sorted, at most ``limit``."""
        low = prefix.lower()
        found = {u for u in self.state.submissions if u.lower().startswith(low)}
        found |= {h.uuid for h in self.state.finished or () if h.uuid.lower().startswith(low)}
        found |= {u for u in self.records if u.lower().startswith(low)}
        if self.history is not None and low:
            found |= set(self.history.uuids_with_prefix(low, limit))
        return sorted(found)[:limit]

    def select(self, query: Query, before: int | None = None, limit: int = 50) -> list[Submission]:
        """Newest first, as ``Store.select``."""
        live = list(self.state.submissions.values()) + list(self.records.values())
        return merge(live, list(self.state.finished or ()), self.history, query, before, limit)

    def knows(self, uuid: str) -> bool:
        """Whether the log has a submission with this uuid."""
        return self.submission(uuid) is not None

    def finished(self, ended_before: str | None = None, page: int = 5000) -> Iterator[list[tuple[str, str, str]]]:
        """Pages of (uuid, status, ts of its last change) of every finished submission, as
        ``History.finished``: those kept in memory or handed off first, then the projection's."""
        seen: set[str] = set()
        extra = []
        for uuid in list(self.records) + [h.uuid for h in self.state.finished or () if h.record is not None]:
            sub = self.submission(uuid)
            if sub is not None and uuid not in seen:
                seen.add(uuid)
                ended = sub.history[-1][2]
                if ended_before is None or ended < ended_before:
                    extra.append((uuid, sub.status, ended))
        if extra:
            yield extra
        if self.history is not None:
            for rows in self.history.finished(ended_before, page):
                rows = [r for r in rows if r[0] not in seen]
                if rows:
                    yield rows

    def close(self) -> None:
        """Close the projection."""
        if self.history is not None:
            self.history.close()

    def __enter__(self) -> View:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_view(events_dir: Path | str) -> View:
    """A read-only View of ``events_dir`` (takes no lock: works beside a running daemon).

    With a usable projection: the newest snapshot no newer than it plus the tail, the
    tail's hand-offs kept in memory. Without one: a full replay keeping every record.
    """
    events_dir = Path(events_dir)
    try:
        history: History | None = History.open(history_path(events_dir), readonly=True)
    except HistoryError:
        history = None
    log = EventLog.open(events_dir, readonly=True)
    try:
        if history is not None and history.seq and not log.check_position(history.position):
            history.close()
            history = None
        if history is None:
            state, records = State(finished=[]), dict[str, Submission]()
            drain = keep_records(records)
            replay_into(log, state, drain=drain)
            drain(state, log.tail)
            return View(state, None, records)
        snap, start, _notes = load_newest(events_dir, REDUCER_VERSION, log.check_position,
                                          max_seq=history.seq)
        state = snap if snap is not None else State()
        state.finished = []
        replay_into(log, state, start)
        state.finished = [h for h in state.finished if h.seq > history.seq]
        return View(state, history)
    except BaseException:
        if history is not None:
            history.close()
        raise
    finally:
        log.close()



def verify_history(events_dir: Path | str, limit: int = 50) -> tuple[int, list[str]]:
    """Compare the history projection with a replay of the log up to the projection's seq.

    Returns (the seq compared at, differences: at most ``limit``). Memory stays small: each
    finished record is compared with its row as the replay hands it over; only records a
    later event changes (revocations) wait for that change.
    """
    events_dir = Path(events_dir)
    history = History.open(history_path(events_dir), readonly=True)
    diffs: list[str] = []
    waiting: dict[str, Submission] = {}   # records whose row carries a later change
    seen = 0

    def note(text: str) -> None:
        if len(diffs) < limit:
            diffs.append(text)

    def compare(uuid: str, record: Submission, seq: int) -> None:
        row = history.get(uuid)
        if row is None:
            note(f"{uuid}: finished at seq {seq} but not in the projection")
        elif row[0] > seq:
            waiting[uuid] = copy.deepcopy(record)
        elif row[0] < seq or row[1] != record:
            fields = [f for f in record.__slots__ if getattr(record, f) != getattr(row[1], f)]
            note(f"{uuid}: the projection's row differs from the log ({', '.join(fields) or 'seq'})")

    def drain(state: State, _pos: Position) -> None:
        nonlocal seen
        handoffs = _take(state)
        for h in handoffs:
            if h.record is not None:
                seen += 1
                compare(h.uuid, h.record, h.seq)
            elif h.change is not None and h.uuid in waiting:
                record = waiting.pop(h.uuid)
                amend(record, h.seq, h.change)
                compare(h.uuid, record, h.seq)

    try:
        log = EventLog.open(events_dir, readonly=True)
        try:
            if history.seq and not log.check_position(history.position):
                return history.seq, [f"the projection's position (seq {history.seq}) is not in the log"]
            state = State(finished=[])
            replay_into(log, state, until=history.seq, drain=drain)
            drain(state, log.tail)
        finally:
            log.close()
        for uuid in waiting:
            note(f"{uuid}: the projection's row has a change the log lacks")
        stored = history.count()
        if stored != seen:
            note(f"the projection holds {stored} finished submissions, the log {seen}")
        return history.seq, diffs
    finally:
        history.close()

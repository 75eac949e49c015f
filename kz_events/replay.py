"""Rebuild a State from the log: the fast path used at open and by ``kz replay``.

``EventLog.read_batches`` checks seq continuity and the hash chain of every line;
this module checks each event's type, version (upcasting old ones) and payload
field names, then folds it with the reducer's handlers. Field *types* are left to
the full decoder (``kz audit``): the chain proves the lines are the ones written,
and the writer validated every event when it was emitted.
"""
from __future__ import annotations

from pathlib import Path

from kz_events.codec import upcast_payload, DecodeError
from kz_events.events import EVENT_TYPES
from kz_events.log import CorruptLog, EventLog, Position
from kz_events.reducer import _HANDLERS, ReducerError
from kz_events.state import State

__all__ = ["replay_into", "replay_dir", "load_state"]


def _offset_of(lines: list[bytes], first_pos: int, index: int) -> int:
    return first_pos + sum(len(line) + 1 for line in lines[:index])


def replay_into(log: EventLog, state: State, start: Position | None = None,
                until: int | None = None) -> int:
    """Fold every event after ``start`` (up to seq ``until``) into ``state``; returns the count.

    Raises CorruptLog for a line that is damaged, of an unknown type or version,
    or refused by the reducer (naming its seq and byte offset).
    """
    current = {t: (cls.VERSION, frozenset(cls.FIELDS)) for t, cls in EVENT_TYPES.items()}
    handlers = _HANDLERS
    count = 0
    expected = state.seq + 1
    if start is not None and start.seq != state.seq:
        raise ValueError(f"state at seq {state.seq} but replay starts after {start.seq}")
    for lines, dicts, first_seq, first_pos, path in log.read_batches(start):
        if until is not None and first_seq + len(dicts) - 1 > until:
            dicts = dicts[:max(0, until - first_seq + 1)]
        if first_seq != expected:
            raise CorruptLog(first_seq, path, first_pos, f"expected seq {expected}")
        i = -1
        try:
            for i, d in enumerate(dicts):
                t = d["type"]
                payload = d["payload"]
                known = current.get(t)
                if known is None:
                    raise DecodeError(f"unknown event type {t!r}")
                if d["v"] != known[0]:
                    payload = upcast_payload(t, d["v"], payload)
                if payload.keys() != known[1]:
                    raise DecodeError(f"{t}: payload fields {sorted(payload)} are not "
                                      f"{sorted(known[1])}")
                seq = d["seq"]
                handlers[t](state, seq, d["ts"], payload)
                state.seq = seq
        except (DecodeError, ReducerError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptLog(first_seq + i, path, _offset_of(lines, first_pos, i),
                             f"{type(exc).__name__}: {exc}") from None
        count += len(dicts)
        expected = first_seq + len(dicts)
        if until is not None and state.seq >= until:
            break
    return count


def replay_dir(events_dir: Path | str) -> State:
    """Full replay of a log directory into a new State, ignoring snapshots.

    Read-only: takes no lock and repairs nothing, so it works beside a running
    daemon (an unterminated last line is not read).
    """
    log = EventLog.open(events_dir, readonly=True)
    try:
        state = State()
        replay_into(log, state)
        return state
    finally:
        log.close()


def load_state(events_dir: Path | str) -> State:
    """The current State of a log, read-only: newest usable snapshot plus the tail."""
    from kz_events.reducer import REDUCER_VERSION
    from kz_events.snapshot import load_newest

    log = EventLog.open(events_dir, readonly=True)
    try:
        state, start, _ = load_newest(Path(events_dir), REDUCER_VERSION, log.check_position)
        state = state if state is not None else State()
        replay_into(log, state, start)
        return state
    finally:
        log.close()

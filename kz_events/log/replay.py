"""Rebuild a State from the log: the fast path used at open and by ``kz replay``.

Every line is checked: its seq follows, its ``prev`` is the sha256 of the line
before, its type and version are known (old versions are upcast), its payload has
exactly the fields of its type, and the reducer accepts it. What is skipped, for
speed, is building the envelope: a line the writer produced is canonical JSON
with sorted keys, ``{"payload":{...},"prev":"…","seq":N,"subject":{…},"ts":"…",
"type":"…","v":N}``, so the header fields are cut out of the bytes and only the
payloads are parsed (a batch of them with one ``json.loads``). A line of any other
shape goes through the full decoder. ``kz audit`` checks field types and
canonical form as well.

A long replay (``PIPELINE_MIN_BYTES`` or more to read, two or more CPUs) runs on
two cores: a worker process (``kz_events.log.replay_worker``) reads the segments,
cuts the lines and checks the hash chain and the seqs, while this process parses
the payloads and folds them. Whatever the worker cannot vouch for, this process
reads and judges itself, so the state and every error are those of a replay in
one process.

"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from operator import ne
from pathlib import Path
from typing import Any

from kz_events.codec import DecodeError, decode_dict, parse_json, upcast_payload
from kz_events.events import EVENT_TYPES
from kz_events.log import replay_worker
from kz_events.log.replay_worker import check_chain, cut_group, payload_array, read_group
from kz_events.log.segments import CorruptLog, EventLog, Position, segment_name
from kz_events.log.snapshot import gc_paused, load_newest
from kz_events.reducer import REDUCER_VERSION, ReducerError, handler_for
from kz_events.state import State

__all__ = ["PIPELINE_MIN_BYTES", "load_state", "replay_dir", "replay_into"]

#: a replay with at least this many bytes to read runs with a worker process
#: (``kz_events.log.replay_worker``) on a machine with two or more CPUs; below it, the
#: worker's start (~0.1 s) would cost more than it saves.
PIPELINE_MIN_BYTES = 32 << 20


def _full_parse(line: bytes) -> tuple[tuple[bytes, ...], dict]:
    """Slow path: decode one line completely (raises DecodeError)."""
    try:
        obj = parse_json(line.decode("utf-8"))
    except ValueError as exc:
        raise DecodeError(f"not a JSON line ({exc})") from None
    env = decode_dict(obj)  # validates and upcasts
    fields = (env.prev.encode(), str(env.seq).encode(), env.ts.encode(),
              env.type.encode(), str(env.v).encode())
    return fields, env.payload


def _parse_group(group: list[bytes]) -> tuple[tuple, list[Any]] | tuple[None, list, list]:
    """Cut a group of lines into header fields and payloads.

    Fast path, every line in the writer's canonical shape: returns (fields, payloads)
    where fields = (prevs, seqs, tss, kinds, cuts) as in ``replay_worker.cut_group``;
    a kind is the line's end, ``,"type":"…","v":N}`` (type and version in one key).
    Otherwise returns (None, parsed, payloads) with each line fully decoded (a
    ``DecodeError`` in place of the payload for a line that does not decode).
    """
    fields = cut_group(group)
    if fields is not None:
        try:
            payloads = parse_json(payload_array(group, fields[4]).decode("utf-8"))
            if len(payloads) == len(group):
                return fields, payloads
        except ValueError:
            pass
    return (None, *_parse_group_slowly(group))


def _parse_group_slowly(group: list[bytes]) -> tuple[list, list]:
    """Every line of a group fully decoded: (fields or None, payload or DecodeError)."""
    parsed: list[tuple[bytes, ...] | None] = []
    payloads: list[dict | DecodeError] = []
    for line in group:
        fields: tuple[bytes, ...] | None
        payload: dict | DecodeError
        try:
            fields, payload = _full_parse(line)
        except DecodeError as exc:
            fields, payload = None, exc
        parsed.append(fields)
        payloads.append(payload)
    return parsed, payloads


def _replay_slowly(state: State, table: dict, group: list[bytes], parsed: list,
                   payloads: list, seq: int, h: bytes, path: Path, pos: int) -> tuple[int, bytes]:
    """Check and fold a group line by line (versions to upcast, or a damaged line to name)."""
    sha = hashlib.sha256
    for line, fields, p in zip(group, parsed, payloads):
        try:
            if fields is None:
                raise p
            prev, s, ts, t, v = fields
            if prev != h:
                raise DecodeError("hash chain broken: prev is not the sha256 of the previous line")
            if int(s) != seq + 1:
                raise DecodeError(f"expected seq {seq + 1}, found {int(s)}")
            entry = table.get(t)
            if entry is None:
                raise DecodeError(f"unknown event type {t.decode()!r}")
            if v != entry[1]:
                p = upcast_payload(entry[3], int(v), p)
            if type(p) is not dict or p.keys() != entry[2]:
                raise DecodeError(f"{entry[3]}: payload fields are not {sorted(entry[2])}")
            entry[0](state, seq + 1, ts.decode(), p)
        except (DecodeError, ReducerError, KeyError, TypeError, AttributeError,
                ValueError) as exc:
            raise CorruptLog(seq + 1, path, pos, f"{type(exc).__name__}: {exc}") from None
        seq += 1
        state.seq = seq
        h = sha(line).hexdigest().encode()
        pos += len(line) + 1
    return seq, h


#: a replay's ``drain`` is called once this many submissions have finished since the last call.
DRAIN_EVERY = 2_000

Drain = Callable[[State, Position], None]


def replay_into(log: EventLog, state: State, start: Position | None = None,
                until: int | None = None, *, worker: bool | None = None,
                drain: Drain | None = None) -> int:
    """Fold every event after ``start`` (up to seq ``until``) into ``state``; returns the count.

    Raises CorruptLog for a line that is damaged, out of sequence, off the hash
    chain, of an unknown type or version, or refused by the reducer (naming its seq
    and byte offset). Sets ``log.tail`` to the position of the last line read.
    ``worker``: read and chain-check in a second process (``kz_events.log.replay_worker``);
    None (the default) does so for a replay of ``PIPELINE_MIN_BYTES`` or more on a
    machine with two or more CPUs. The result is the same either way.
    ``drain(state, position)``: called between groups of lines once ``state.finished``
    holds ``DRAIN_EVERY`` hand-offs, with the position of the last line folded, to
    empty it (the store writes them to the history projection), so a long replay
    does not hold the whole history in memory. The caller drains what is left.
    """
    if drain is not None and state.finished is None:
        raise ValueError("a drain needs state.finished to be a list")
    with gc_paused():
        return _replay(log, state, start, until, worker, drain)


def _tables() -> dict:
    """Handlers and fields by type (line-by-line path) and by line end (fast path, key None)."""
    table: dict = {t.encode(): (handler_for(cls), str(cls.VERSION).encode(), frozenset(cls.FIELDS), t)
                   for t, cls in EVENT_TYPES.items()}
    # the fast path's table: a line's end (type and version) -> handler, fields,
    # type, version to upcast from (0: current)
    kinds = {f',"type":"{t}","v":{v}}}'.encode(): (
        handler_for(cls), frozenset(cls.FIELDS), t, 0 if v == cls.VERSION else v)
        for t, cls in EVENT_TYPES.items() for v in range(1, cls.VERSION + 1)}
    current = {end: entry for end, entry in kinds.items() if not entry[3]}
    table[None] = (kinds, {end: e[0] for end, e in current.items()},
                   {end: e[1] for end, e in current.items()})
    return table


def _replay(log: EventLog, state: State, start: Position | None,
            until: int | None, worker: bool | None, drain: Drain | None) -> int:
    if start is None:
        start = log.start_position()
    if start.seq != state.seq:
        raise ValueError(f"state at seq {state.seq} but replay starts after {start.seq}")
    table = _tables()
    count = 0
    if until is None and (worker or (worker is None and _worth_a_worker(log, start))):
        count, start = _replay_with_worker(log, state, table, start, drain)
        if start is None:
            return count
    return count + _replay_here(log, state, table, start, until, drain)


def _cpus() -> int:
    """The CPUs this process may run on, as ``kz_runner.contract.host.usable_cpus`` counts them (kz_events,
    the bottom layer, imports nothing above it): a pin to one CPU leaves no room for a worker."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _worth_a_worker(log: EventLog, start: Position) -> bool:
    if _cpus() < 2:
        return False
    total = 0
    for first in log.segments:
        if first >= start.segment:
            try:
                total += (log.dir / segment_name(first)).stat().st_size
            except OSError:
                return False
    return total - start.offset >= PIPELINE_MIN_BYTES


def _maybe_drain(state: State, tail: Position, drain: Drain | None) -> None:
    if drain is not None:
        assert state.finished is not None  # replay_into refuses a drain without the hand-off list
        if len(state.finished) >= DRAIN_EVERY:
            drain(state, tail)


def _replay_here(log: EventLog, state: State, table: dict, start: Position,
                 until: int | None, drain: Drain | None = None) -> int:
    """The replay in this process alone, from ``start``."""
    seq, h = start.seq, start.hash.encode()
    tail = start
    count = 0
    for first in log.segments:
        if first < start.segment:
            continue
        path = log.dir / segment_name(first)
        offset = start.offset if first == start.segment else 0
        if first != start.segment:
            _check_segment_name(first, seq, path)
            tail = Position(seq, h.decode(), first, 0, 0)
        pos = offset
        try:
            for group in log.iter_lines(first, offset):
                if until is not None and seq + len(group) > until:
                    group = group[:max(0, until - seq)]
                if not group:
                    break
                seq, h, pos = _fold_group(state, table, group, seq, h, path, pos)
                count += len(group)
                tail = Position(seq, h.decode(), first, pos - len(group[-1]) - 1, pos)
                _maybe_drain(state, tail, drain)
                if until is not None and seq >= until:
                    log.tail = tail
                    return count
        except CorruptLog as exc:
            if exc.seq != -1:
                raise
            raise CorruptLog(seq + 1, exc.path, exc.offset, exc.reason) from None
    log.tail = tail
    return count


def _check_segment_name(first: int, seq: int, path: Path) -> None:
    if first != seq + 1:
        raise CorruptLog(seq + 1, path, 0,
                         f"segment named {first} but the previous segment ends at seq {seq}")


def _replay_with_worker(log: EventLog, state: State, table: dict, start: Position,
                        drain: Drain | None = None) -> tuple[int, Position | None]:
    """Fold what a worker vouches for; returns (count, None) at the end of the log, or
    (count, the position to carry on from in this process) when the worker stops early."""
    proc = replay_worker.spawn(log.dir, log.segments, start.segment, start.offset, start.seq,
                               start.hash)
    if proc is None:
        return 0, start
    seq, h = start.seq, start.hash.encode()
    segment, pos, tail = start.segment, start.offset, start
    path = log.dir / segment_name(segment)
    count = 0
    try:
        for msg in replay_worker.messages(proc.stdout):
            kind = msg[0]
            if kind == "S":
                if msg[1] != segment:
                    segment, pos = msg[1], 0
                    path = log.dir / segment_name(segment)
                    _check_segment_name(segment, seq, path)
                    tail = Position(seq, h.decode(), segment, 0, 0)
                continue
            if kind == "E":
                log.tail = tail
                return count, None
            if (kind != "V" and kind != "U") or msg[1] != segment or msg[2] != pos:
                break  # the worker stopped ("X") or lost its way: carry on here
            end, n = msg[3], msg[4]
            if kind == "V":
                seq, h, last_len = _fold_vouched(state, table, msg, seq, h, path)
            else:
                group = read_group(path, pos, end)
                seq, h, _ = _fold_group(state, table, group, seq, h, path, pos)
                last_len = len(group[-1])
            count += n
            pos = end
            tail = Position(seq, h.decode(), segment, end - last_len - 1, end)
            _maybe_drain(state, tail, drain)
    finally:
        replay_worker.stop(proc)
    return count, tail


def _fold_vouched(state: State, table: dict, msg: tuple, seq: int, h: bytes,
                  path: Path) -> tuple[int, bytes, int]:
    """Fold a group the worker vouched for; returns (last seq, its hash, last line's length)."""
    _, _, start, end, n, last_hash, last_len, text, tss, kinds = msg
    try:
        payloads = parse_json(text.decode("utf-8"))
        tss = tss.decode("ascii").split(" ")
    except ValueError:
        payloads = None
    if type(payloads) is not list or len(payloads) != n or len(tss) != n:
        group = read_group(path, start, end)  # what the in-process path makes of it
        seq, h, _ = _fold_group(state, table, group, seq, h, path, start)
        return seq, h, len(group[-1])
    try:
        done = _fold_checked(state, table[None], seq, tss, kinds.split(b"\n"), payloads)
    except _Refused as refused:
        group = read_group(path, start, end)
        raise refused.corrupt(group, path, start) from None
    if done == n:
        state.seq = seq + n
        return seq + n, last_hash, last_len
    group = read_group(path, start, end)  # the rest line by line, from the line it stopped at
    if done:
        seq += done
        state.seq = seq
        h = hashlib.sha256(group[done - 1]).hexdigest().encode()
    seq, h = _finish_group(state, table, group, done, seq, h, path, start)
    return seq, h, len(group[-1])


def _fold_group(state: State, table: dict, group: list[bytes], seq: int, h: bytes,
                path: Path, pos: int) -> tuple[int, bytes, int]:
    """Check and fold one group of lines; returns (last seq, its hash, offset after the group)."""
    n = len(group)
    end = pos + sum(map(len, group)) + n
    cut = _parse_group(group)
    if cut[0] is None:
        parsed, payloads = cut[1:]
        return (*_replay_slowly(state, table, group, parsed, payloads, seq, h, path, pos), end)
    digests = check_chain(cut[0], group, seq, h)
    done = 0
    if digests is not None:
        fields, payloads = cut
        tss: Sequence[str]
        try:
            tss = b" ".join(fields[2]).decode("ascii").split(" ")
        except UnicodeDecodeError:
            tss = ()
        if len(tss) == n:
            try:
                done = _fold_checked(state, table[None], seq, tss, fields[3], payloads)
            except _Refused as refused:
                raise refused.corrupt(group, path, pos) from None
    if done:
        assert digests is not None  # lines were folded only when their chain checked out
        h = digests[done - 1].hex().encode()
        seq += done
        state.seq = seq
    return (*_finish_group(state, table, group, done, seq, h, path, pos), end)


def _finish_group(state: State, table: dict, group: list[bytes], done: int, seq: int,
                  h: bytes, path: Path, pos: int) -> tuple[int, bytes]:
    """Fold ``group[done:]`` line by line (``seq``/``h``: after line ``done``)."""
    if done == len(group):
        return seq, h
    rest = group[done:]
    pos_rest = pos + sum(map(len, group[:done])) + done
    parsed, payloads = _parse_group_slowly(rest)
    return _replay_slowly(state, table, rest, parsed, payloads, seq, h, path, pos_rest)


class _Refused(Exception):
    """Line ``index`` of a group failed on the fast path (the state is at the line before)."""

    def __init__(self, index: int, seq: int, reason: str):
        super().__init__(reason)
        self.index, self.seq, self.reason = index, seq, reason

    def corrupt(self, group: list[bytes], path: Path, pos: int) -> CorruptLog:
        """The CorruptLog naming the line, given the group's lines and where they start."""
        where = pos + sum(len(line) + 1 for line in group[:self.index])
        return CorruptLog(self.seq, path, where, self.reason)


def _fold_checked(state: State, tables: tuple, seq: int, tss: Sequence[str], ends, payloads: list) -> int:
    """Fold lines whose chain and seqs are checked; returns how many were folded.

    Stops before the first line of a kind (type and version) it does not know, for
    the line-by-line path to judge. When every line is of a current version and its
    payload has exactly the fields of its type (checked for the whole batch at once),
    the lines go straight to their handlers. Raises ``_Refused`` for a line whose
    payload or transition is refused.
    """
    kinds, handler_of, fields_of = tables
    try:
        plain = not any(map(ne, map(dict.keys, payloads), map(fields_of.get, ends)))
    except TypeError:  # a payload that is not an object: the loop below names it
        plain = False
    at = seq
    try:
        if plain:
            for handler, ts, p in zip(map(handler_of.__getitem__, ends), tss, payloads):
                at += 1
                handler(state, at, ts, p)
            return at - seq
        for end, ts, p in zip(ends, tss, payloads):
            entry = kinds.get(end)
            if entry is None:
                break
            at += 1
            handler, fields, name, old = entry
            if old:  # an older version of the event: upcast it
                p = upcast_payload(name, old, p)
            if p.keys() != fields:
                raise DecodeError(f"{name}: payload fields {sorted(p)} are "
                                  f"not {sorted(fields)}")
            handler(state, at, ts, p)
        else:
            return at - seq
    except (DecodeError, ReducerError, KeyError, TypeError, AttributeError,
            ValueError) as exc:
        state.seq = at - 1
        raise _Refused(at - seq - 1, at, f"{type(exc).__name__}: {exc}") from None
    return at - seq


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
    log = EventLog.open(events_dir, readonly=True)
    try:
        state, start, _ = load_newest(Path(events_dir), REDUCER_VERSION, log.check_position)
        state = state if state is not None else State()
        replay_into(log, state, start)
        return state
    finally:
        log.close()

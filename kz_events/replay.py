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

"""
from __future__ import annotations

import hashlib
import json
from operator import ne
from pathlib import Path
from typing import Any

from kz_events.codec import DecodeError, decode_dict, parse_json, upcast_payload
from kz_events.events import EVENT_TYPES
from kz_events.log import CorruptLog, EventLog, Position, segment_name
from kz_events.reducer import _HANDLERS, ReducerError
from kz_events.snapshot import gc_paused
from kz_events.state import State

__all__ = ["replay_into", "replay_dir", "load_state"]

BATCH = 2048
_HEAD = b'{"payload":'
_PREV = b',"prev":"'


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


_SEQ = b'","seq":'
_TS = b',"ts":"'
def _parse_group(group: list[bytes]) -> tuple[tuple, list[Any]] | tuple[None, list, list]:
    """Cut a group of lines into header fields and payloads.

    Fast path, every line in the writer's canonical shape: returns (fields, payloads)
    where fields = (prevs, seqs, tss, kinds) as tuples of bytes, one per line; a
    kind is the line's end, ``,"type":"…","v":N}`` (type and version in one key).
    Otherwise returns (None, parsed, payloads) with each line fully decoded (a
    ``DecodeError`` in place of the payload for a line that does not decode).
    """
    try:
        cuts = [line.rfind(_PREV) if line.startswith(_HEAD) else -1 for line in group]
        tcuts = [line.rfind(b',"type":"', c) for line, c in zip(group, cuts)]
        if all([c > 0 and line[c + 73:c + 81] == _SEQ and line[t - 35:t - 28] == _TS
                for line, c, t in zip(group, cuts, tcuts)]):
            payloads = parse_json(
                "[" + b",".join([line[11:c] for line, c in zip(group, cuts)]).decode("utf-8") + "]")
            if len(payloads) == len(group):
                fields = (
                    tuple([line[c + 9:c + 73] for line, c in zip(group, cuts)]),
                    tuple([line[c + 81:line.find(b",", c + 81)] for line, c in zip(group, cuts)]),
                    tuple([line[t - 28:t - 1] for line, t in zip(group, tcuts)]),
                    tuple([line[t:] for line, t in zip(group, tcuts)]),
                )
                return fields, payloads
    except ValueError:
        pass
    return (None, *_parse_group_slowly(group))


def _parse_group_slowly(group: list[bytes]) -> tuple[list, list]:
    """Every line of a group fully decoded: (fields or None, payload or DecodeError)."""
    parsed, payloads = [], []
    for line in group:
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


def replay_into(log: EventLog, state: State, start: Position | None = None,
                until: int | None = None) -> int:
    """Fold every event after ``start`` (up to seq ``until``) into ``state``; returns the count.

    Raises CorruptLog for a line that is damaged, out of sequence, off the hash
    chain, of an unknown type or version, or refused by the reducer (naming its seq
    and byte offset). Sets ``log.tail`` to the position of the last line read.
    """
    with gc_paused():
        return _replay(log, state, start, until)


def _replay(log: EventLog, state: State, start: Position | None,
            until: int | None) -> int:
    if start is None:
        start = log.start_position()
    if start.seq != state.seq:
        raise ValueError(f"state at seq {state.seq} but replay starts after {start.seq}")
    table = {t.encode(): (_HANDLERS[t], str(cls.VERSION).encode(), frozenset(cls.FIELDS), t)
             for t, cls in EVENT_TYPES.items()}
    # the fast path's table: a line's end (type and version) -> handler, fields,
    # type, version to upcast from (0: current)
    kinds = {f',"type":"{t}","v":{v}}}'.encode(): (
        _HANDLERS[t], frozenset(cls.FIELDS), t, 0 if v == cls.VERSION else v)
        for t, cls in EVENT_TYPES.items() for v in range(1, cls.VERSION + 1)}
    current = {end: entry for end, entry in kinds.items() if not entry[3]}
    table[None] = (kinds, {end: e[0] for end, e in current.items()},
                   {end: e[1] for end, e in current.items()})
    seq, h = start.seq, start.hash.encode()
    tail = start
    count = 0
    for first in log.segments:
        if first < start.segment:
            continue
        path = log.dir / segment_name(first)
        offset = start.offset if first == start.segment else 0
        if first != start.segment and first != seq + 1:
            raise CorruptLog(seq + 1, path, 0,
                             f"segment named {first} but the previous segment ends at seq {seq}")
        if first != start.segment:
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
                if until is not None and seq >= until:
                    log.tail = tail
                    return count
        except CorruptLog as exc:
            if exc.seq != -1:
                raise
            raise CorruptLog(seq + 1, exc.path, exc.offset, exc.reason) from None
    log.tail = tail
    return count


def _fold_group(state: State, table: dict, group: list[bytes], seq: int, h: bytes,
                path: Path, pos: int) -> tuple[int, bytes, int]:
    """Check and fold one group of lines; returns (last seq, its hash, offset after the group)."""
    n = len(group)
    cut = _parse_group(group)
    done, parsed, payloads = 0, None, None
    if cut[0] is not None:
        digests = _check_chain(cut[0], group, seq, h)
        if digests is not None:
            (_, _, tss, kinds), payloads = cut
            try:
                tss = b" ".join(tss).decode("ascii").split(" ")
            except UnicodeDecodeError:
                tss = ()
            done = 0 if len(tss) != n else _fold_checked(state, table[None], group, seq, tss, kinds, payloads, path, pos)
            if done:
                seq += done
                h = digests[done - 1].hex().encode()
                state.seq = seq
            payloads = None
    else:
        parsed, payloads = cut[1:]
    if done < n:  # from the first line the fast path could not take: line by line
        rest = group[done:]
        pos_rest = pos + sum(map(len, group[:done])) + done
        if parsed is None:
            parsed, payloads = _parse_group_slowly(rest)
        seq, h = _replay_slowly(state, table, rest, parsed, payloads, seq, h, path, pos_rest)
    end = pos + sum(map(len, group)) + n
    return seq, h, end


def _check_chain(fields: tuple, group: list[bytes], seq: int, h: bytes) -> list[bytes] | None:
    """The lines' sha256 digests if their prevs form the chain from ``h`` and seqs follow ``seq``."""
    sha = hashlib.sha256
    prevs, seqs = fields[0], fields[1]
    # the chain, checked in one comparison: binary digests of lines 1..n-1
    # against the prev fields of lines 2..n (the first prev against h)
    digests = [sha(line).digest() for line in group]
    joined = b"".join(prevs)
    try:  # lower case only, as the writer writes them (else the slow path decides)
        prev_blob = bytes.fromhex(joined.decode("ascii")) if joined.islower() else b""
    except ValueError:
        prev_blob = b""
    if (prevs[0] == h and prev_blob[32:] == b"".join(digests[:-1])
            and list(map(int, seqs)) == list(range(seq + 1, seq + len(group) + 1))):
        return digests
    return None


def _fold_checked(state: State, tables: tuple, group: list[bytes], seq: int, tss: list[str],
                  ends: tuple, payloads: list, path: Path, pos: int) -> int:
    """Fold lines whose chain and seqs are checked; returns how many were folded.

    Stops before the first line of a kind (type and version) it does not know, for
    the line-by-line path to judge. When every line is of a current version and its
    payload has exactly the fields of its type (checked for the whole batch at once),
    the lines go straight to their handlers.
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
            return len(group)
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
            return len(group)
    except (DecodeError, ReducerError, KeyError, TypeError, AttributeError,
            ValueError) as exc:
        j = at - seq - 1
        state.seq = at - 1
        where = pos + sum(len(line) + 1 for line in group[:j])
        raise CorruptLog(at, path, where, f"{type(exc).__name__}: {exc}") from None
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

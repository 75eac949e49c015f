"""Event <-> canonical JSON line, the envelope, and upcasting of old event versions.

A log line is the canonical JSON of the envelope (``canonical_bytes``: sorted keys,
no spaces, UTF-8, no NaN) followed by ``\\n``. The hash chain links lines: ``prev``
of line n is ``sha256(canonical bytes of line n-1)``; 64 zeros for seq 1.

Decoding is strict: an unknown type, an unknown version, a missing or extra field
or a field of the wrong type raises ``DecodeError``. An old version of a known type
is upcast at read time by the functions declared in ``UPCASTERS`` (the log is
never rewritten): one table, read by every reader of the log, that no import fills in.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from json import encoder as _enc
from typing import Any

from kz_events.events import EVENT_TYPES, Event

__all__ = [
    "GENESIS", "DecodeError", "Envelope", "canonical_bytes", "line_hash", "format_ts", "format_ts_seconds",
    "encode", "encode_fast", "TimestampFormatter", "decode_line", "decode_dict", "UPCASTERS", "upcast_payload",
    "subject_of",
]

#: ``prev`` of the first event.
GENESIS = "0" * 64
ENVELOPE_KEYS = frozenset(("seq", "ts", "type", "v", "subject", "payload", "prev"))

def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in an event")


#: strict parser: NaN and Infinity are refused like any other non-JSON.
parse_json = json.JSONDecoder(parse_constant=_refuse_constant).decode

def _not_json(obj: Any) -> Any:
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _make_dumps() -> Callable[[Any], str]:
    """The canonical encoder: json's C encoder built once (``JSONEncoder.encode`` builds one
    per call), sorted keys, compact, no ASCII escaping, NaN refused."""
    slow = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                            allow_nan=False).encode
    make_encoder = getattr(_enc, "c_make_encoder", None)  # not in json's type stubs
    if make_encoder is None:  # pragma: no cover - CPython always has it
        return slow
    # markers=None: no cycle check (event payloads are JSON data, not object graphs)
    fast = make_encoder(None, _not_json, _enc.encode_basestring, None, ":", ",",
                        True, False, False)

    def dumps(obj: Any) -> str:
        """Canonical JSON text of ``obj``."""
        if type(obj) is str:
            return _enc.encode_basestring(obj)
        return "".join(fast(obj, 0))

    return dumps


_dumps = _make_dumps()


class DecodeError(ValueError):
    """A line or payload that is not a valid event of a known type and version."""


def canonical_bytes(obj: Any) -> bytes:
    """The canonical encoding: ``json.dumps(sort_keys, compact, ensure_ascii=False, allow_nan=False)`` as UTF-8."""
    return _dumps(obj).encode("utf-8")


def line_hash(line: bytes) -> str:
    """sha256 hex of a line's canonical bytes (pass the line without its newline)."""
    return hashlib.sha256(line).hexdigest()


def format_ts(epoch: float) -> str:
    """UTC RFC 3339 with microseconds, e.g. ``2026-11-30T06:30:45.123456Z``: the log's ``ts``."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def format_ts_seconds(epoch: float) -> str:
    """UTC RFC 3339 with seconds, e.g. ``2026-11-30T06:30:45Z``: the timestamps of documents (not the log's)."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Envelope:
    """One decoded log line: the event's position, time, type, subject and payload."""

    seq: int
    ts: str
    type: str
    v: int
    subject: dict
    payload: dict
    prev: str

    def event(self) -> Event:
        """The payload as an instance of the event's dataclass (current version)."""
        return EVENT_TYPES[self.type](**self.payload)

    def to_dict(self) -> dict[str, Any]:
        """The envelope as the dict that is encoded into the log line."""
        return {"seq": self.seq, "ts": self.ts, "type": self.type, "v": self.v,
                "subject": self.subject, "payload": self.payload, "prev": self.prev}


def subject_of(event: Event, kernel_id: str | None = None) -> dict[str, str]:
    """The envelope subject of ``event``: its ``uuid`` and ``kernel_id`` (or the one given)."""
    subject: dict[str, str] = {}
    uuid = getattr(event, "uuid", None)
    if uuid is not None:
        subject["submission"] = uuid
    kid = getattr(event, "kernel_id", None) or kernel_id
    if kid is not None:
        subject["kernel_id"] = kid
    return subject


def encode(event: Event, seq: int, ts: str, prev: str,
           subject: dict[str, str] | None = None) -> tuple[bytes, Envelope]:
    """Encode ``event`` at ``seq``: returns (canonical line bytes without newline, envelope)."""
    if type(event) is not EVENT_TYPES.get(event.TYPE):
        raise DecodeError(f"{type(event).__name__} is not a registered event class")
    env = Envelope(seq, ts, event.TYPE, event.VERSION,
                   subject if subject is not None else subject_of(event),
                   event.payload(), prev)
    return canonical_bytes(env.to_dict()), env


_CONTAINERS: dict[type, bool] = {}


def _has_containers(cls: type[Event]) -> bool:
    """Whether events of ``cls`` carry lists or dicts (which JSON may change: tuples, keys)."""
    found = _CONTAINERS.get(cls)
    if found is None:
        found = _CONTAINERS[cls] = any(allowed[0] in (list, dict)
                                       for allowed, _ in cls._CHECKS.values())
    return found


def encode_fast(event: Event, seq: int, ts: str, prev: str,
                subject: dict[str, str]) -> tuple[bytes, dict]:
    """The writer's encoder: (canonical line bytes, payload exactly as a reader will see it).

    Builds the same bytes as ``canonical_bytes(envelope)`` (sorted keys: payload,
    prev, seq, subject, ts, type, v) without sorting the envelope, and re-reads
    the payload only when it holds lists or dicts. ``ts`` must come from
    ``format_ts`` and ``prev`` be hex (neither needs escaping).
    """
    payload = event.payload()
    pj = _dumps(payload)
    line = (f'{{"payload":{pj},"prev":"{prev}","seq":{seq},"subject":{_dumps(subject)},'
            f'"ts":"{ts}","type":"{event.TYPE}","v":{event.VERSION}}}').encode()
    if _has_containers(type(event)):
        payload = parse_json(pj)
    return line, payload


class TimestampFormatter:
    """``format_ts`` with the seconds part cached (the writer formats one per event)."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def __call__(self, epoch: float) -> str:
        """UTC RFC 3339 with microseconds, e.g. ``2026-11-30T06:30:45.123456Z``."""
        second = int(epoch // 1)
        micros = int(round((epoch - second) * 1e6))
        if micros >= 1_000_000:  # rounding up to the next second
            second, micros = second + 1, micros - 1_000_000
        if second != self._second:
            self._prefix = datetime.fromtimestamp(second, UTC).strftime(
                "%Y-%m-%dT%H:%M:%S.")
            self._second = second
        return f"{self._prefix}{micros:06d}Z"


# --- upcasting ----------------------------------------------------------------------

# Each lifts one version's payload (a fresh dict it may change) to the next version's shape.

def _received_v1(payload: dict) -> dict:
    """Version 1 predates idempotency keys: no upload carried one."""
    payload["idempotency_key"] = None
    return payload


def _validated_v1(payload: dict) -> dict:
    """Version 1 predates the locked harness: no submission then changed it."""
    payload["harness_change"] = False
    return payload


def _reported_v1(payload: dict) -> dict:
    """Version 1 cases predate unit and direction: they read as unknown."""
    payload["cases"] = [dict(c, unit=None, direction=None) if isinstance(c, dict) else c
                        for c in payload["cases"]]
    return payload


def _completed_v1(payload: dict) -> dict:
    """Version 1 predates the accept's outcome: those accepts recorded none."""
    payload["outcome"] = None
    return payload


#: (type, version) -> the function lifting that version's payload to version + 1. Every old
#: version a log may hold is declared here, next to the decoder that uses it; a type whose
#: ``VERSION`` goes up gets its entry in the same change (tests/test_events_codec.py checks
#: that every type has a path from version 1 to its current version).
UPCASTERS: dict[tuple[str, int], Callable[[dict], dict]] = {
    ("submission.received", 1): _received_v1,
    ("submission.validated", 1): _validated_v1,
    ("result.reported", 1): _reported_v1,
    ("accept.completed", 1): _completed_v1,
}


def upcast_payload(type_word: str, version: int, payload: dict) -> dict:
    """Lift ``payload`` of ``type_word`` version ``version`` to the current version."""
    cls = EVENT_TYPES.get(type_word)
    if cls is None:
        raise DecodeError(f"unknown event type {type_word!r}")
    if version > cls.VERSION or version < 1:
        raise DecodeError(f"{type_word} v{version} is unknown (current v{cls.VERSION})")
    while version < cls.VERSION:
        fn = UPCASTERS.get((type_word, version))
        if fn is None:
            raise DecodeError(f"no upcaster for {type_word} v{version}")
        payload = fn(dict(payload))
        version += 1
    return payload


# --- decoding -------------------------------------------------------------------------


def check_payload(type_word: str, payload: Any) -> None:
    """Raise DecodeError unless ``payload`` has exactly the fields (and types) of the current version."""
    cls = EVENT_TYPES.get(type_word)
    if cls is None:
        raise DecodeError(f"unknown event type {type_word!r}")
    if type(payload) is not dict:
        raise DecodeError(f"{type_word}: payload must be an object")
    keys = payload.keys()
    if keys != set(cls.FIELDS):
        missing = sorted(set(cls.FIELDS) - keys)
        extra = sorted(keys - set(cls.FIELDS))
        raise DecodeError(f"{type_word}: missing fields {missing}, unknown fields {extra}")
    for name, (allowed, nullable) in cls._CHECKS.items():
        value = payload[name]
        if value is None:
            if nullable:
                continue
            raise DecodeError(f"{type_word}: field {name!r} is null")
        if type(value) is bool and bool not in allowed:
            raise DecodeError(f"{type_word}: field {name!r} is a boolean")
        if float in allowed and type(value) is int:
            continue
        if not isinstance(value, allowed):
            raise DecodeError(f"{type_word}: field {name!r} has type {type(value).__name__}")


def decode_dict(obj: Any) -> Envelope:
    """Validate a parsed line (dict) and return its Envelope, upcasting an old version."""
    if type(obj) is not dict:
        raise DecodeError("an event line must be a JSON object")
    if obj.keys() != ENVELOPE_KEYS:
        raise DecodeError(
            f"envelope keys {sorted(obj.keys())} differ from {sorted(ENVELOPE_KEYS)}"
        )
    seq, ts, type_word, v = obj["seq"], obj["ts"], obj["type"], obj["v"]
    subject, payload, prev = obj["subject"], obj["payload"], obj["prev"]
    if type(seq) is not int or seq < 1:
        raise DecodeError(f"seq must be a positive integer, got {seq!r}")
    if type(ts) is not str or len(ts) != 27 or not ts.endswith("Z"):
        raise DecodeError(f"ts must be RFC 3339 UTC with microseconds, got {ts!r}")
    if type(v) is not int:
        raise DecodeError(f"v must be an integer, got {v!r}")
    if type(prev) is not str or len(prev) != 64:
        raise DecodeError("prev must be 64 hex digits")
    if type(subject) is not dict or not subject.keys() <= {"submission", "kernel_id"}:
        raise DecodeError(f"bad subject {subject!r}")
    if type_word not in EVENT_TYPES:
        raise DecodeError(f"unknown event type {type_word!r}")
    if v != EVENT_TYPES[type_word].VERSION:
        payload = upcast_payload(type_word, v, payload)
        v = EVENT_TYPES[type_word].VERSION
    check_payload(type_word, payload)
    return Envelope(seq, ts, type_word, v, subject, payload, prev)


def decode_line(line: bytes) -> Envelope:
    """Parse and validate one log line (with or without its newline)."""
    try:
        obj = parse_json(line.decode("utf-8"))
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise DecodeError(f"not JSON: {exc}") from None
    return decode_dict(obj)

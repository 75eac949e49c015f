"""The event catalogue, the codec and schemas/event.json."""
from __future__ import annotations

import dataclasses
import json
import random

import jsonschema
import pytest

from kz_events import codec, events as E
from kz_events.codec import DecodeError, Envelope, canonical_bytes, decode_line, encode
from kz_events.read.workload import simulate
from kz_schemas import load

SAMPLE = {str: "x", int: 3, float: 1.5, bool: True, list: [], dict: {}}


def sample_event(cls: type[E.Event]) -> E.Event:
    """An instance of ``cls`` with a plausible value of the right type in each field."""
    values = {}
    for f in dataclasses.fields(cls):
        (allowed,), _ = cls._CHECKS[f.name]
        schema = f.metadata["schema"]
        if "enum" in schema:
            values[f.name] = schema["enum"][0]
        elif "pattern" in schema and "64" in schema["pattern"]:
            values[f.name] = "a" * 64
        elif "pattern" in schema:
            values[f.name] = "b" * 40
        else:
            values[f.name] = SAMPLE[allowed]
    return cls(**values)


ALL = sorted(E.EVENT_TYPES.values(), key=lambda c: c.TYPE)


def test_catalogue_has_every_type_of_the_architecture_doc():
    notes = open("docs/architecture.md", encoding="utf-8").read()
    table = notes[notes.index("| type | payload"):notes.index("Events are built as")]
    listed = {line.split("`")[1] for line in table.splitlines() if line.startswith("| `")}
    assert listed == set(E.EVENT_TYPES)


def test_every_event_class_is_documented():
    for cls in ALL:
        assert cls.__doc__ and len(cls.__doc__) > 20, cls
        for f in dataclasses.fields(cls):
            assert f.metadata["doc"], (cls, f.name)


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.TYPE)
def test_every_type_round_trips_and_validates_against_the_schema(cls):
    event = sample_event(cls)
    line, env = encode(event, 7, "2026-11-30T06:00:00.000001Z", "0" * 64)
    jsonschema.Draft202012Validator(load("event")).validate(json.loads(line))
    back = decode_line(line)
    assert back == env
    assert back.event() == event


def test_committed_schema_is_generated_from_the_catalogue():
    assert load("event") == json.loads(json.dumps(E.json_schema())), \
        "stale schemas/event.json: run python -m kz_events.events > schemas/event.json"
    jsonschema.Draft202012Validator.check_schema(load("event"))


def test_schema_describes_every_property():
    def walk(node, path):
        if isinstance(node, dict):
            for name, prop in (node.get("properties") or {}).items():
                assert "description" in prop, f"{path}.{name}"
            for key, value in node.items():
                if key not in ("if", "then"):  # conditions, not property definitions
                    walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")
    walk(load("event"), "$")


def test_schema_refuses_a_payload_of_the_wrong_type():
    line, _ = encode(E.JobQueued("u", "k", "sm_90"), 1, "2026-11-30T06:00:00.000001Z", "0" * 64)
    doc = json.loads(line)
    doc["payload"]["surprise"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, load("event"))


def test_simulated_events_all_validate_against_the_schema():
    validator = jsonschema.Draft202012Validator(load("event"))
    prev = codec.GENESIS
    for seq, event in enumerate(simulate(random.Random(3), 400), 1):
        line, _ = encode(event, seq, "2026-11-30T06:00:00.000001Z", prev)
        validator.validate(json.loads(line))
        prev = codec.line_hash(line)


def test_canonical_bytes_are_sorted_compact_utf8():
    assert canonical_bytes({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()
    with pytest.raises(ValueError):
        canonical_bytes({"x": float("nan")})


def test_construction_checks_field_types():
    with pytest.raises(TypeError, match="attempt"):
        E.JobClaimed("u", "r", "l", 1.0, True)
    with pytest.raises(TypeError, match="uuid"):
        E.JobQueued(None, "k", "a")
    assert E.JobClaimed("u", "r", "l", 5, 1).lease_expires_at == 5.0
    assert isinstance(E.JobClaimed("u", "r", "l", 5, 1).lease_expires_at, float)


def _line(**changes) -> bytes:
    line, _ = encode(E.JobQueued("u", "k", "sm_90"), 1, "2026-11-30T06:00:00.000001Z", "0" * 64)
    doc = json.loads(line)
    for key, value in changes.items():
        if key.startswith("payload_"):
            doc["payload"][key[8:]] = value
        else:
            doc[key] = value
    return canonical_bytes(doc)


@pytest.mark.parametrize("changes, message", [
    ({"type": "job.teleported"}, "unknown event type"),
    ({"v": 9}, "v9 is unknown"),
    ({"payload_extra": 1}, "unknown fields"),
    ({"payload_arch": 5}, "arch"),
    ({"seq": 0}, "seq"),
    ({"prev": "x"}, "prev"),
])
def test_decoding_fails_loudly(changes, message):
    with pytest.raises(DecodeError, match=message):
        decode_line(_line(**changes))


def test_decoding_refuses_nan_and_garbage():
    with pytest.raises(DecodeError):
        decode_line(_line().replace(b'"v":1', b'"v":NaN'))
    with pytest.raises(DecodeError):
        decode_line(b"\xff\xfe")


def test_an_old_version_is_upcast_at_read_time(monkeypatch):
    # pretend job.queued v1 lacked arch and v2 is current: v1 lines must still read
    monkeypatch.setattr(E.JobQueued, "VERSION", 2)
    monkeypatch.setitem(codec.UPCASTERS, ("job.queued", 1),
                        lambda p: {**p, "arch": "gfx928"})
    old = json.loads(_line())
    del old["payload"]["arch"]
    old["v"] = 1
    env = decode_line(canonical_bytes(old))
    assert env.v == 2 and env.payload["arch"] == "gfx928"
    monkeypatch.delitem(codec.UPCASTERS, ("job.queued", 1))
    with pytest.raises(DecodeError, match="no upcaster"):
        decode_line(canonical_bytes(old))


def test_envelope_subject_names_submission_and_kernel():
    _, env = encode(E.JobQueued("u1", "k/1", "a"), 1, "2026-11-30T06:00:00.000001Z", "0" * 64)
    assert env.subject == {"submission": "u1", "kernel_id": "k/1"}
    _, env = encode(E.IndexUpdated(1, None, 0), 1, "2026-11-30T06:00:00.000001Z", "0" * 64)
    assert env.subject == {}
    assert isinstance(env, Envelope)


def test_format_ts_is_utc_with_microseconds():
    assert codec.format_ts(0.5) == "1970-01-01T00:00:00.500000Z"


def test_the_writers_fast_encoder_produces_canonical_bytes():
    prev = codec.GENESIS
    for seq, event in enumerate(simulate(random.Random(8), 500), 1):
        subject = codec.subject_of(event, "k/x" if seq % 3 else None)
        fast, payload = codec.encode_fast(event, seq, "2026-11-30T06:00:00.000001Z", prev, subject)
        slow, env = encode(event, seq, "2026-11-30T06:00:00.000001Z", prev, subject)
        assert fast == slow
        assert payload == env.payload == json.loads(fast)["payload"]
        prev = codec.line_hash(fast)
    odd = E.SubmissionRejected("u", "intake", "C", "é \"quoted\" \n", {"k": (1, 2), "n": None})
    fast, payload = codec.encode_fast(odd, 1, "2026-11-30T06:00:00.000001Z", codec.GENESIS, {})
    assert fast == encode(odd, 1, "2026-11-30T06:00:00.000001Z", codec.GENESIS, {})[0]
    assert payload["details"] == {"k": [1, 2], "n": None}


def test_timestamp_formatter_matches_format_ts():
    fmt = codec.TimestampFormatter()
    rng = random.Random(2)
    for _ in range(5000):
        t = rng.uniform(0, 2e9)
        assert fmt(t) == codec.format_ts(t)
    assert fmt(1.9999999) == codec.format_ts(1.9999999) == "1970-01-01T00:00:02.000000Z"

"""Upcasters are a declared table (``kz_events.codec.UPCASTERS``), not registered by importing a module.

Every event type has a path from version 1 to its current version in the table, the table
names nothing else, and an old line of each type that has one reads as the current version
in a process that imported only the codec: no other module has to be imported first for a
reader of the log to understand it.
"""
from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from kz_events import codec, events as E
from kz_events.read.workload import simulate
from tests.helpers.daemon import ROOT

VERSIONED = sorted(t for t, cls in E.EVENT_TYPES.items() if cls.VERSION > 1)


def test_every_type_has_a_path_from_version_1_to_its_current_version():
    missing = [(t, v) for t, cls in E.EVENT_TYPES.items() for v in range(1, cls.VERSION)
               if (t, v) not in codec.UPCASTERS]
    assert missing == []


def test_the_table_names_only_old_versions_of_known_types():
    for type_word, version in codec.UPCASTERS:
        assert type_word in E.EVENT_TYPES, type_word
        assert 1 <= version < E.EVENT_TYPES[type_word].VERSION, (type_word, version)


def _current_sample(type_word: str) -> dict:
    """A payload of ``type_word``'s current version, from the simulated workload."""
    for seed in range(20):
        for event in simulate(random.Random(seed), 3000):
            if event.TYPE == type_word:
                return json.loads(json.dumps(event.payload(), default=lambda c: c.to_json()))
    raise AssertionError(f"the workload never emits {type_word}")


def _old_sample(type_word: str) -> dict:
    """The current sample without the fields the upcasters fill in: what a version 1 line held."""
    payload = _current_sample(type_word)
    for name in list(payload):
        try:
            lifted = codec.upcast_payload(type_word, 1, {k: v for k, v in payload.items() if k != name})
        except (KeyError, TypeError, codec.DecodeError):
            continue  # version 1 had this field: the upcasters read it
        if name in lifted:
            del payload[name]
    return payload


@pytest.mark.parametrize("type_word", VERSIONED)
def test_a_version_1_line_reads_as_the_current_version_with_only_the_codec_imported(type_word):
    payload = _old_sample(type_word)
    cls = E.EVENT_TYPES[type_word]
    lifted = codec.upcast_payload(type_word, 1, json.loads(json.dumps(payload)))
    assert set(payload) < set(cls.FIELDS) or lifted != payload, type_word  # version 1 differed
    line = codec.canonical_bytes({"seq": 1, "ts": "2026-11-30T06:00:00.000001Z", "type": type_word, "v": 1,
                                  "subject": {}, "payload": payload, "prev": codec.GENESIS})
    program = ("import json, sys\n"
               "from kz_events.codec import decode_line\n"
               "env = decode_line(sys.stdin.buffer.read())\n"
               "loaded = sorted(m for m in sys.modules if m.startswith('kz_events'))\n"
               "print(json.dumps({'v': env.v, 'fields': sorted(env.payload), 'loaded': loaded}))\n")
    done = subprocess.run([sys.executable, "-c", program], input=line, capture_output=True, cwd=ROOT,
                          timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr.decode()
    result = json.loads(done.stdout)
    assert result["v"] == cls.VERSION and result["fields"] == sorted(cls.FIELDS)
    assert "kz_events.reducer" not in result["loaded"], result["loaded"]

"""kz_events.log.replay: the fast path (header fields cut from the bytes, one kind key per
line, payloads parsed in batches) against the line-by-line decoder and old versions,
each in one process and with the reading worker (``kz_events.log.replay_worker``)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kz_events import codec, events as E
from kz_events.codec import GENESIS, canonical_bytes, line_hash
from kz_events.log import replay as replay_module, replay_worker
from kz_events.log.replay import replay_dir
from kz_events.log.segments import CorruptLog, segment_name
from kz_events.read.workload import build_log


@pytest.fixture(params=["here", "worker"], autouse=True)
def mode(request, monkeypatch):
    """Every test of this file runs in one process and with the worker (forced for small logs)."""
    spawned = []
    if request.param == "worker":
        monkeypatch.setattr(replay_module, "PIPELINE_MIN_BYTES", 0)
        monkeypatch.setattr(replay_module, "_cpus", lambda: 2)
        real_spawn = replay_worker.spawn

        def counting_spawn(*args):
            proc = real_spawn(*args)
            spawned.append(proc)
            return proc

        monkeypatch.setattr(replay_worker, "spawn", counting_spawn)
    yield request.param
    if request.param == "worker":
        assert spawned and all(p is not None for p in spawned), "the worker was not used"


def _rewrite(segment: Path, edit) -> None:
    """Re-encode every line after ``edit(obj)`` and re-link the hash chain."""
    out, prev = [], GENESIS
    for raw in segment.read_bytes().splitlines():
        obj = json.loads(raw)
        obj = edit(obj) or obj
        obj["prev"] = prev
        line = canonical_bytes(obj)
        prev = line_hash(line)
        out.append(line)
    segment.write_bytes(b"\n".join(out) + b"\n")


def _verdict(events_dir: Path):
    """The replayed State, or the CorruptLog's (seq, offset, reason)."""
    try:
        return replay_dir(events_dir)
    except CorruptLog as exc:
        return ("corrupt", exc.seq, exc.offset, exc.reason)


def test_old_versions_are_upcast_on_the_fast_path(tmp_path, monkeypatch):
    # pretend job.queued v1 lacked arch and v2 is current: the log's v1 lines replay
    events_dir = tmp_path / "events"
    expected = build_log(events_dir, 400, 3)
    archs = {}

    def to_v1(obj):
        if obj["type"] == "job.queued":
            archs[obj["seq"]] = obj["payload"].pop("arch")
        return obj

    _rewrite(events_dir / segment_name(1), to_v1)
    assert archs
    monkeypatch.setattr(E.JobQueued, "VERSION", 2)
    monkeypatch.setitem(codec.UPCASTERS, ("job.queued", 1), lambda p: {**p, "arch": "sm_90"})
    with pytest.raises(CorruptLog) as info:  # the upcaster guesses sm_90: gfx928 jobs are refused
        replay_dir(events_dir)
    assert archs[info.value.seq] != "sm_90"
    monkeypatch.setitem(codec.UPCASTERS, ("job.queued", 1),
                        lambda p: {**p, "arch": archs_by_uuid[p["uuid"]]})
    archs_by_uuid = {}
    for raw in (events_dir / segment_name(1)).read_bytes().splitlines():
        obj = json.loads(raw)
        if obj["seq"] in archs:
            archs_by_uuid[obj["payload"]["uuid"]] = archs[obj["seq"]]
    state = replay_dir(events_dir)
    assert state.seq == expected.seq
    assert state.submissions == expected.submissions and state.queue == expected.queue


@pytest.mark.parametrize("damage, reason", [
    ("unknown type", "unknown event type 'job.teleported'"),
    ("unknown version", "job.queued v7 is unknown"),
    ("extra field", "payload fields"),
])
def test_a_line_the_fast_path_cannot_take_is_named_by_seq_and_offset(tmp_path, damage, reason):
    events_dir = tmp_path / "events"
    build_log(events_dir, 300, 4)
    segment = events_dir / segment_name(1)
    lines = segment.read_bytes().splitlines()
    target = next(json.loads(raw)["seq"] for raw in lines[100:]
                  if json.loads(raw)["type"] == "job.queued")

    def damage_it(obj):
        if obj["seq"] == target:
            if damage == "unknown type":
                obj["type"] = "job.teleported"
            elif damage == "unknown version":
                obj["v"] = 7
            else:
                obj["payload"]["colour"] = "red"
        return obj

    _rewrite(segment, damage_it)
    offset = sum(len(raw) + 1 for raw in lines[:target - 1])
    verdict = _verdict(events_dir)
    assert verdict[:3] == ("corrupt", target, offset)
    assert reason in verdict[3]


def test_a_line_of_another_spelling_mid_batch_folds_like_the_writers_lines(tmp_path):
    # a line whose end is not the writer's spelling (valid JSON all the same) hands the
    # rest of its batch to the line-by-line path: the state must not change
    events_dir = tmp_path / "events"
    expected = build_log(events_dir, 500, 8)

    segment = events_dir / segment_name(1)
    lines = segment.read_bytes().splitlines()
    i = 200  # same event, other bytes: a space before the closing brace
    lines[i] = lines[i][:-1] + b" }"
    assert json.loads(lines[i])["seq"] == i + 1
    prev = line_hash(lines[i])
    for j in range(i + 1, len(lines)):
        o = json.loads(lines[j])
        o["prev"] = prev
        lines[j] = canonical_bytes(o)
        prev = line_hash(lines[j])
    segment.write_bytes(b"\n".join(lines) + b"\n")
    state = replay_dir(events_dir)
    assert state.seq == 500
    assert state.submissions == expected.submissions and state.queue == expected.queue
    assert state.kernels == expected.kernels


def _state_parts(state):
    return (state.seq, state.submissions, state.queue, state.kernels, state.status_counts)


def test_a_multi_segment_log_replays_to_the_incremental_state(tmp_path):
    events_dir = tmp_path / "events"
    expected = build_log(events_dir, 3000, 11, segment_bytes=200_000)
    assert len(list(events_dir.glob("*.jsonl"))) > 3
    assert _state_parts(replay_dir(events_dir)) == _state_parts(expected)


def _flip(events_dir: Path, seq: int, at: int) -> int:
    """Change one byte of line ``seq`` (``at`` bytes into it); returns the line's offset."""
    segment = events_dir / segment_name(1)
    data = bytearray(segment.read_bytes())
    lines = bytes(data).split(b"\n")
    offset = sum(len(raw) + 1 for raw in lines[:seq - 1])
    data[offset + at] = ord("#") if data[offset + at] != ord("#") else ord("$")
    segment.write_bytes(bytes(data))
    return offset


@pytest.mark.parametrize("seq, at", [(1, 5), (150, 3), (150, 20), (420, 100), (599, 30)])
def test_a_flipped_byte_is_named_as_in_one_process(tmp_path, monkeypatch, mode, seq, at):
    events_dir = tmp_path / "events"
    build_log(events_dir, 600, 12)
    offset = _flip(events_dir, seq, at)
    verdict = _verdict(events_dir)
    assert verdict[0] == "corrupt" and verdict[1] in (seq, seq + 1)
    if mode == "worker":  # the same words as a replay without the worker
        monkeypatch.setattr(replay_module, "PIPELINE_MIN_BYTES", 1 << 60)
        assert _verdict(events_dir) == verdict
    if verdict[1] == seq:
        assert verdict[2] == offset


def test_a_segment_that_does_not_end_with_a_newline_is_named(tmp_path):
    events_dir = tmp_path / "events"
    build_log(events_dir, 2000, 13, segment_bytes=150_000)
    first = sorted(events_dir.glob("*.jsonl"))[0]
    first.write_bytes(first.read_bytes()[:-1])  # the middle segment loses its last newline
    verdict = _verdict(events_dir)
    assert verdict[0] == "corrupt" and "does not end with a newline" in verdict[3]

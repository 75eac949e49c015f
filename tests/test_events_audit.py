"""The audit: every edit, deletion or damage in the middle of the log is found, with its seq."""
from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from kz_events.codec import GENESIS, canonical_bytes, line_hash
from kz_events.log.segments import list_segments, segment_name
from kz_events.log.store import Store
from kz_events.read.audit import check_anchors, verify_log
from kz_events.read.workload import build_log, simulate

N = 80


@pytest.fixture(scope="module")
def base_log():
    """A simulated log of N events over a few segments: {segment file name: bytes}."""
    with tempfile.TemporaryDirectory() as tmp:
        events_dir = Path(tmp) / "events"
        build_log(events_dir, N, 11, batch=5, segment_bytes=8_000)
        files = {segment_name(f): (events_dir / segment_name(f)).read_bytes()
                 for f in list_segments(events_dir)}
    assert len(files) > 1
    return files


def lines_of(files: dict[str, bytes]) -> list[tuple[str, int, bytes]]:
    """(segment name, offset, line with newline) for every line, in order."""
    out = []
    for name in sorted(files):
        data, pos = files[name], 0
        for line in data.splitlines(keepends=True):
            out.append((name, pos, line))
            pos += len(line)
    return out


def audit(files: dict[str, bytes]):
    with tempfile.TemporaryDirectory() as tmp:
        events_dir = Path(tmp) / "events"
        events_dir.mkdir()
        for name, data in files.items():
            (events_dir / name).write_bytes(data)
        return verify_log(events_dir)


def test_an_intact_log_has_no_findings(base_log):
    assert audit(base_log) == []


@settings(max_examples=250, deadline=None)
@given(data=st.data())
def test_flipping_any_byte_in_the_middle_is_found_at_its_seq(base_log, data):
    lines = lines_of(base_log)
    k = data.draw(st.integers(1, N - 1), label="seq")   # not the last event
    name, offset, line = lines[k - 1]
    i = data.draw(st.integers(0, len(line) - 1), label="byte")
    new = data.draw(st.integers(0, 255).filter(lambda b: b != line[i]), label="value")
    files = dict(base_log)
    blob = bytearray(files[name])
    blob[offset + i] = new
    files[name] = bytes(blob)
    findings = audit(files)
    assert findings, "the audit missed an edit"
    assert findings[0].seq == k, [str(f) for f in findings]


@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, N - 1))
def test_deleting_any_line_in_the_middle_is_found_at_its_seq(base_log, k):
    lines = lines_of(base_log)
    name, offset, line = lines[k - 1]
    files = dict(base_log)
    files[name] = files[name][:offset] + files[name][offset + len(line):]
    findings = audit(files)
    assert findings and findings[0].seq == k, [str(f) for f in findings]
    assert any(f.code == "MISSING_SEQ" for f in findings)


def test_a_torn_tail_is_a_warning_not_an_error(base_log):
    files = dict(base_log)
    last = sorted(files)[-1]
    files[last] = files[last][:-10]
    findings = audit(files)
    assert [(f.code, f.severity, f.seq) for f in findings] == [("TORN_TAIL", "warning", N)]


def test_an_inserted_line_is_found(base_log):
    lines = lines_of(base_log)
    name, offset, line = lines[30]
    files = dict(base_log)
    files[name] = files[name][:offset] + line + files[name][offset:]
    findings = audit(files)
    assert findings and findings[0].seq == 32


def test_kz_audit_exit_codes_and_json(tmp_path, base_log, capsys):
    from kz_daemon.cli import main

    events_dir = tmp_path / "events"
    events_dir.mkdir()
    for name, data in base_log.items():
        (events_dir / name).write_bytes(data)
    assert main(["audit", "--state-dir", str(tmp_path)]) == 0
    assert "0 error(s)" in capsys.readouterr().out
    name, offset, line = lines_of(base_log)[40]
    path = events_dir / name
    blob = bytearray(path.read_bytes())
    blob[offset + 5] ^= 0x20
    path.write_bytes(bytes(blob))
    assert main(["audit", "--state-dir", str(tmp_path), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["findings"][0]["seq"] == 41
    assert main(["audit", "--state-dir", str(tmp_path / "nowhere")]) == 2


def _anchored_log(tmp_path) -> tuple[Path, list[tuple[int, str]]]:
    """A log over several segments and the chain heads a store reported along the way."""
    events_dir = tmp_path / "events"
    anchors = []
    rng = random.Random(5)
    with Store.open(events_dir, snapshot_every=0, segment_bytes=6_000, fsync=False) as store:
        anchors.append(store.chain_head())
        batch = []
        for ev in simulate(rng, 200):
            batch.append(ev)
            if len(batch) == 7:
                store.emit(*batch)
                batch = []
                anchors.append(store.chain_head())
    assert len(list_segments(events_dir)) > 2
    return events_dir, anchors


def test_anchors_taken_from_the_store_hold_on_its_log(tmp_path):
    events_dir, anchors = _anchored_log(tmp_path)
    assert anchors[0] == (0, GENESIS) and len(anchors) > 20
    assert check_anchors(events_dir, anchors) == []


def test_a_log_rewritten_with_a_fresh_chain_fails_its_anchors(tmp_path):
    # verify_log cannot see this: the edited line and every one after it are re-chained
    events_dir, anchors = _anchored_log(tmp_path)
    target = anchors[len(anchors) // 2][0]
    rewritten = []
    prev = GENESIS
    for first in list_segments(events_dir):
        path = events_dir / segment_name(first)
        out = []
        for raw in path.read_bytes().splitlines():
            obj = json.loads(raw)
            if obj["seq"] == target:
                obj["ts"] = "2020-01-01T00:00:00.000000Z"
            obj["prev"] = prev
            line = canonical_bytes(obj)
            prev = line_hash(line)
            out.append(line)
        rewritten.append((path, b"\n".join(out) + b"\n"))
    for path, data in rewritten:
        path.write_bytes(data)
    assert verify_log(events_dir) == []
    findings = check_anchors(events_dir, anchors)
    assert findings and {f.code for f in findings} == {"ANCHOR_MISMATCH"}
    assert [f.seq for f in findings] == [s for s, _ in anchors if s >= target]
    first = findings[0]
    line = (events_dir / first.segment).read_bytes()[first.offset:].split(b"\n", 1)[0]
    assert json.loads(line)["seq"] == target


def test_anchors_beyond_the_end_or_of_another_hash_are_named(tmp_path):
    events_dir, anchors = _anchored_log(tmp_path)
    last_seq, last_head = anchors[-1]
    findings = check_anchors(events_dir, [(last_seq + 5, last_head), (3, "0" * 64),
                                          (last_seq, last_head), (0, "1" * 64)])
    assert [(f.code, f.seq) for f in findings] == [
        ("ANCHOR_MISMATCH", 0), ("ANCHOR_MISMATCH", 3), ("ANCHOR_MISSING", last_seq + 5)]
    assert check_anchors(tmp_path / "nowhere", [(1, last_head)])[0].code == "ANCHOR_MISSING"

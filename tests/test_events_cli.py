"""``kz events tail [--follow]|show`` and ``kz replay [--verify]`` on a real log."""
from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from kz_daemon.cli import main
from kz_events.log.reading import replay_finished
from kz_events.log.store import Store
from kz_events.read import story
from kz_events.read.workload import build_log, simulate


@pytest.fixture()
def state_dir(tmp_path):
    build_log(tmp_path / "events", 600, 21, snapshot_every=0)
    with Store.open(tmp_path / "events", fsync=False) as store:
        store.snapshot()
    # every submission, live or finished, as the log alone says (the State keeps only live ones)
    live, finished = replay_finished(tmp_path / "events")
    return tmp_path, SimpleNamespace(seq=live.seq, submissions={**finished, **live.submissions})


def test_tail_prints_the_last_events(state_dir, capsys):
    path, state = state_dir
    assert main(["events", "tail", "--state-dir", str(path), "-n", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5 and lines[-1].split()[0] == str(state.seq)
    assert main(["events", "tail", "--state-dir", str(path), "-n", "2", "--json"]) == 0
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [d["seq"] for d in docs] == [state.seq - 1, state.seq]


def test_show_tells_a_submissions_story(state_dir, capsys):
    path, state = state_dir
    uuid, sub = next((u, s) for u, s in state.submissions.items() if s.status == "accepted")
    assert main(["events", "show", uuid, "--state-dir", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"submission {uuid}" in out and "status     accepted" in out
    assert "accepted: source" in out and sub.sha_src[:12] in out
    assert main(["events", "show", uuid, "--state-dir", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "accepted" and doc["sha_src"] == sub.sha_src
    assert {h[0] for h in sub.history} <= {e["seq"] for e in doc["events"]}
    assert all(e["subject"]["submission"] == uuid for e in doc["events"])
    assert main(["events", "show", "no-such-uuid", "--state-dir", str(path)]) == 1
    assert main(["events", "tail", "--state-dir", str(path / "missing")]) == 2


def test_replay_summarises_and_verifies_against_the_snapshot(state_dir, capsys):
    path, state = state_dir
    assert main(["replay", "--state-dir", str(path), "--verify", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["seq"] == state.seq and doc["submissions"] == len(state.submissions)
    assert doc["verify"]["ok"] is True and doc["verify"]["seq"] == state.seq
    assert main(["replay", "--state-dir", str(path)]) == 0
    assert f"replayed {state.seq} events" in capsys.readouterr().out


def test_replay_verify_exits_1_when_the_snapshot_diverges(state_dir, capsys):
    path, state = state_dir
    snap = next((path / "events" / "snapshots").glob("*.snap"))
    header, _, body = snap.read_bytes().partition(b"\n")
    import hashlib
    import marshal

    doc = marshal.loads(body)
    doc["index"][0] += 1  # a snapshot that disagrees with the log
    body = marshal.dumps(doc)
    head = json.loads(header)
    head.update(body_sha256=hashlib.sha256(body).hexdigest(), body_bytes=len(body))
    snap.write_bytes(json.dumps(head).encode() + b"\n" + body)
    assert main(["replay", "--state-dir", str(path), "--verify"]) == 1
    out = capsys.readouterr().out
    assert "DIVERGES" in out and "index_version" in out


def test_follow_yields_new_events_across_segments_reading_only_new_bytes(tmp_path):
    events_dir = tmp_path / "events"
    events = list(simulate(random.Random(5), 900))
    store = Store.open(events_dir, fsync=False, segment_bytes=60_000, snapshot_every=0)
    store.emit(*events[:100])
    batches = iter([events[100:400], events[400:900]])
    polls = []

    def sleep(_seconds):
        """Each poll: the writer appends a batch (rotating segments on the way)."""
        polls.append(len(list(events_dir.glob("*.jsonl"))))
        batch = next(batches, None)
        if batch is None:
            raise KeyboardInterrupt  # nothing more to write: end the follow
        store.emit(*batch)

    seen = []
    with pytest.raises(KeyboardInterrupt):
        for event in story.follow_events(events_dir, 50, sleep=sleep):
            seen.append(event["seq"])
    store.close()
    assert seen == list(range(51, 901))
    assert len(list(events_dir.glob("*.jsonl"))) > polls[0] >= 1  # it crossed into new segments


def test_tail_follow_prints_events_as_a_writer_appends_them(tmp_path):
    events = list(simulate(random.Random(6), 300))
    store = Store.open(tmp_path / "events", fsync=False, snapshot_every=0)
    store.emit(*events[:10])
    proc = subprocess.Popen([sys.executable, "-m", "kz_daemon.cli", "events", "tail", "-n", "3",
                             "--follow", "--json", "--state-dir", str(tmp_path)],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        got = [json.loads(proc.stdout.readline())["seq"] for _ in range(3)]
        assert got == [8, 9, 10]
        store.emit(*events[10:300])
        deadline = time.monotonic() + 30
        while got[-1] < 300 and time.monotonic() < deadline:
            got.append(json.loads(proc.stdout.readline())["seq"])
        assert got == list(range(8, 301))
        proc.send_signal(signal.SIGINT)  # Ctrl-C ends it quietly
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        store.close()


def test_follow_shows_a_line_only_once_its_newline_is_written(tmp_path):
    events_dir = tmp_path / "events"
    events = list(simulate(random.Random(7), 3))
    with Store.open(events_dir, fsync=False, snapshot_every=0) as store:
        store.emit(*events[:2])
    segment = next(events_dir.glob("*.jsonl"))
    lines = segment.read_bytes().splitlines(keepends=True)
    segment.write_bytes(lines[0] + lines[1][:40])  # the second line is still being written
    steps = iter([lambda: segment.write_bytes(lines[0] + lines[1])])

    def sleep(_seconds):
        step = next(steps, None)
        if step is None:
            raise KeyboardInterrupt
        step()

    seen = []
    with pytest.raises(KeyboardInterrupt):
        for event in story.follow_events(events_dir, 0, sleep=sleep):
            seen.append(event["seq"])
    assert seen == [1, 2]


def test_show_takes_the_eight_character_prefix_tail_prints(state_dir, capsys):
    path, state = state_dir
    uuid = next(u for u, s in state.submissions.items() if s.status == "accepted")
    assert main(["events", "tail", "--state-dir", str(path), "-n", "1000"]) == 0
    printed = {line.split()[3] for line in capsys.readouterr().out.splitlines() if len(line.split()) > 3}
    assert uuid[:8] in printed  # what a user copies from tail
    assert main(["events", "show", uuid[:8], "--state-dir", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["submission"] == uuid and doc["status"] == "accepted"
    assert main(["events", "show", uuid[:8].upper(), "--state-dir", str(path)]) == 0
    assert f"submission {uuid}" in capsys.readouterr().out


def test_show_takes_the_seq_of_one_of_the_submissions_events(state_dir, capsys):
    path, state = state_dir
    uuid, sub = next((u, s) for u, s in state.submissions.items() if s.status == "accepted")
    seq = sub.history[-1][0]
    if any(u.startswith(str(seq)) for u in state.submissions):
        pytest.skip("the seq is also a uuid prefix in this log")
    assert main(["events", "show", str(seq), "--state-dir", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["submission"] == uuid


def test_show_lists_the_candidates_of_an_ambiguous_prefix_and_exits_2(state_dir, capsys):
    path, state = state_dir
    uuids = sorted(state.submissions)
    prefix = next(u[:1] for u in uuids if sum(v.startswith(u[:1]) for v in uuids) >= 2)
    matching = [u for u in uuids if u.startswith(prefix)]
    assert main(["events", "show", prefix, "--state-dir", str(path)]) == 2
    captured = capsys.readouterr()
    assert "ambiguous" in captured.err and captured.out == ""
    listed = [line.split()[0] for line in captured.err.splitlines()[1:] if not line.lstrip().startswith("...")]
    assert listed == matching[:len(listed)] and len(listed) == min(len(matching), 20)


def test_show_says_an_unknown_prefix_matches_nothing(state_dir, capsys):
    path, state = state_dir
    unknown = next(p for p in ("zz", "qq") if not any(u.startswith(p) for u in state.submissions))
    assert main(["events", "show", unknown, "--state-dir", str(path)]) == 1
    assert f"no submission matches {unknown!r}" in capsys.readouterr().err


def test_replay_verify_fails_when_the_log_has_no_events(tmp_path, capsys):
    (tmp_path / "events").mkdir()
    assert main(["replay", "--state-dir", str(tmp_path), "--verify"]) == 1
    assert "nothing to verify" in capsys.readouterr().out
    assert main(["replay", "--state-dir", str(tmp_path), "--verify", "--json"]) == 1
    verify = json.loads(capsys.readouterr().out)["verify"]
    assert verify["ok"] is False and verify["checked"] == []
    assert main(["replay", "--state-dir", str(tmp_path)]) == 0  # a plain replay of an empty log is fine
    assert main(["replay", "--state-dir", str(tmp_path / "missing"), "--verify"]) == 2


def test_replay_verify_without_a_snapshot_says_it_verified_the_log_only(tmp_path, capsys):
    state = build_log(tmp_path / "events", 50, 3, snapshot_every=0)
    assert main(["replay", "--state-dir", str(tmp_path), "--verify"]) == 0
    out = capsys.readouterr().out
    assert f"verify: verified the log only ({state.seq} events" in out and "no snapshot" in out
    assert main(["replay", "--state-dir", str(tmp_path), "--verify", "--json"]) == 0
    verify = json.loads(capsys.readouterr().out)["verify"]
    assert verify["ok"] is True and verify["checked"] == ["log", "history"] and verify["snapshot"] is None


def test_replay_verify_names_the_snapshot_it_compared(state_dir, capsys):
    path, state = state_dir
    assert main(["replay", "--state-dir", str(path), "--verify"]) == 0
    out = capsys.readouterr().out
    snap = next((path / "events" / "snapshots").glob("*.snap")).name
    assert f"and snapshot {snap}: the state replayed up to seq {state.seq} equals it" in out


def test_replay_verify_compares_the_history_projection_with_the_log(state_dir, capsys):
    path, state = state_dir
    assert main(["replay", "--state-dir", str(path), "--verify", "--json"]) == 0
    verify = json.loads(capsys.readouterr().out)["verify"]
    assert verify["checked"] == ["log", "snapshot", "history"]
    assert verify["history"] == {"ok": True, "seq": state.seq, "differences": []}
    uuid = next(u for u, s in state.submissions.items() if s.status == "rejected")
    db = sqlite3.connect(path / "events" / "history.sqlite")
    with db:
        db.execute("UPDATE submissions SET doc = (SELECT doc FROM submissions WHERE status = 'accepted' "
                   "LIMIT 1) WHERE uuid = ?", (uuid,))
    db.close()
    assert main(["replay", "--state-dir", str(path), "--verify"]) == 1
    out = capsys.readouterr().out
    assert "DIVERGES" in out and f"history: {uuid}: the projection's row differs from the log" in out


def test_show_finds_a_finished_submission_without_the_history_projection(state_dir, capsys):
    path, state = state_dir
    uuid, sub = next((u, s) for u, s in state.submissions.items() if s.status == "rejected")
    for name in ("history.sqlite", "history.sqlite-wal", "history.sqlite-shm"):
        (path / "events" / name).unlink(missing_ok=True)
    assert main(["events", "show", uuid, "--state-dir", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "rejected" and doc["reasons"] == sub.reasons

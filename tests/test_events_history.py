"""The history projection: finished submissions on disk, exact after a crash, rebuilt when it cannot serve."""
from __future__ import annotations

import marshal
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from kz_events import events as E
from kz_events.log import history as history_module
from kz_events.log.history import History, Query, history_path
from kz_events.log.reading import open_view, replay_finished, verify_history
from kz_events.log.snapshot import list_snapshots, read_snapshot, snapshot_dir
from kz_events.log.store import Store
from kz_events.read.workload import build_history, history

KID = "sm_90/A/x/fp16/k"


def received(uuid, kid=KID, submitter="alice", key=None):
    return [E.SubmissionReceived(uuid, kid, submitter, "http", "p.tar.gz", 10, "a" * 64, key),
            E.SubmissionValidated(uuid, kid, "sm_90", False, []),
            E.JobQueued(uuid, kid, "sm_90")]


def rejected(uuid, kid=KID, submitter="alice", key=None):
    return received(uuid, kid, submitter, key) + [E.SubmissionRejected(uuid, "intake", "C", "m", {})]


def everything(events_dir):
    """Every submission the log alone gives, live and finished, by uuid."""
    state, finished = replay_finished(events_dir)
    return {**finished, **state.submissions}


def test_finished_submissions_leave_the_state_and_are_read_from_the_projection(tmp_path):
    with Store.open(tmp_path, fsync=False) as store:
        store.emit(*rejected("u1"))
        store.emit(*received("u2", kid="sm_90/B/x/fp16/k"))
        assert set(store.state.submissions) == {"u2"}
        assert store.submission("u1").status == "rejected"  # hand-off or projection, whichever holds it
        store.flush_history()
        assert store.state.finished == [] and store.history.get("u1")[1] == everything(tmp_path)["u1"]
        assert store.submission("u1") == everything(tmp_path)["u1"] and store.knows("u1")
        assert store.submission("u2") is store.state.submissions["u2"]
        assert store.submission("nope") is None and not store.knows("nope")
    with Store.open(tmp_path, fsync=False) as store:  # a snapshot-free reopen reads it back
        assert store.submission("u1") == everything(tmp_path)["u1"]


def test_a_revocation_waiting_in_the_hand_off_is_seen_at_once(tmp_path):
    with Store.open(tmp_path, fsync=False) as store:
        store.emit(*received("u1"), E.JobClaimed("u1", "r1", "L1", 1.0, 1),
                   E.ResultReported("u1", "r1", "L1", "c" * 64, True, True, [], {}),
                   E.AcceptStarted("u1", KID, None), E.AcceptSourceCommitted("u1", "1" * 40, None),
                   E.AcceptScorecardCommitted("u1", "1" * 40, "2" * 40), E.AcceptCompleted("u1", "1" * 40, "2" * 40))
        store.flush_history()
        assert store.history.get("u1")[1].status == "accepted"
        with store.lock:  # the history thread cannot write the hand-off while we hold the lock
            store.emit(E.SubmissionRevoked("u1", "admin", "bad runner"))
            assert store.history.get("u1")[1].status == "accepted"
            sub = store.submission("u1")
            assert sub.status == "revoked" and sub.reasons[-1]["code"] == "REVOKED"
            assert [s.uuid for s in store.select(Query(status="revoked"))] == ["u1"]
            assert store.select(Query(status="accepted")) == []
            assert [s.uuid for s in store.kernel_records(KID, ("revoked",))] == ["u1"]
        store.flush_history()
        assert store.history.get("u1")[1] == sub
        assert store.accept_latency()["count"] == 0


def test_select_filters_pages_newest_first_across_live_and_finished(tmp_path):
    with Store.open(tmp_path, fsync=False) as store:
        for i in range(12):
            who = "alice" if i % 2 else "bob"
            kid = f"sm_90/A/x/fp16/k{i % 3}"
            store.emit(*(rejected(f"u{i:02d}", kid, who) if i % 4 else received(f"u{i:02d}", kid, who)))
        store.flush_history()
        newest = [s.uuid for s in store.select(Query(), limit=50)]
        assert newest == [f"u{i:02d}" for i in reversed(range(12))]
        alice = store.select(Query(submitter="alice"), limit=4)
        assert [s.uuid for s in alice] == ["u11", "u09", "u07", "u05"]
        cursor = alice[-1].history[0][0]
        assert [s.uuid for s in store.select(Query(submitter="alice"), before=cursor, limit=4)] == ["u03", "u01"]
        assert [s.uuid for s in store.select(Query(status="queued"))] == ["u08", "u04", "u00"]
        assert [s.uuid for s in store.select(Query(kernel_id="sm_90/A/x/fp16/k1", status="rejected"))] == \
            ["u10", "u07", "u01"]
        assert len(store.select(Query(kernel_prefix="sm_90/A"))) == 12
        assert store.select(Query(kernel_prefix="sm_90/A/x/fp16/k")) == []  # a folder, not a string prefix
        last = store.submission("u11").received_at
        assert [s.uuid for s in store.select(Query(since=last))] == ["u11"]


@pytest.mark.parametrize("window", [3, 5000])
def test_since_gives_the_same_rows_through_the_time_index_or_the_arrival_order(tmp_path, monkeypatch, window):
    monkeypatch.setattr(history_module, "SINCE_WINDOW", window)  # 3: every since here takes the scan
    with Store.open(tmp_path, fsync=False) as store:
        for i in range(30):
            store.emit(*rejected(f"u{i:02d}", submitter="alice" if i % 3 else "bob"))
        store.flush_history()
        stamps = [store.submission(f"u{i:02d}").received_at for i in range(30)]
        for cut in (0, 10, 25, 29):
            for who in (None, "bob"):
                expected = [f"u{i:02d}" for i in reversed(range(30))
                            if stamps[i] >= stamps[cut] and who in (None, "bob" if i % 3 == 0 else "alice")]
                got = [s.uuid for s in store.select(Query(submitter=who, since=stamps[cut]), limit=4)]
                assert got == expected[:4], (cut, who)


def test_an_idempotency_key_is_found_after_its_submission_finished(tmp_path):
    with Store.open(tmp_path, fsync=False) as store:
        store.emit(*rejected("u1", key="K"))
        assert store.state.idempotency == {}
        entry = store.idempotency("alice", "K")
        assert entry == ["u1", "a" * 64, store.submission("u1").received_at]
        store.flush_history()
        assert store.idempotency("alice", "K") == entry and store.idempotency("bob", "K") is None
        store.emit(*received("u2", key="K"))  # a later upload takes the key over
        assert store.idempotency("alice", "K")[0] == "u2"


def test_snapshots_hold_no_finished_submission_and_follow_the_projection(tmp_path):
    events = list(history(random.Random(2), 300, kernels=50, submitters=20))
    with Store.open(tmp_path, fsync=False) as store:
        store.emit(*events[:len(events) // 2])
        path = store.snapshot()
        assert store.history.seq >= store.state.seq  # the projection first, then the snapshot
        _header, pos, body = read_snapshot(path)
        assert {row[0] for row in body["submissions"]} == set(store.state.submissions)
        assert all(row[5] not in ("accepted", "rejected", "failed", "cancelled", "revoked")
                   for row in body["submissions"])
        store.emit(*events[len(events) // 2:])
    with Store.open(tmp_path, fsync=False) as store:
        assert store.report["snapshot_seq"] == pos.seq and store.report["history"]["rebuilt"] is None
    seq, diffs = verify_history(tmp_path)
    assert diffs == [] and seq == len(events)


@pytest.mark.parametrize("damage", ["missing", "garbage", "another log", "another layout"])
def test_a_projection_that_cannot_serve_is_rebuilt_from_the_log(tmp_path, damage):
    events = list(history(random.Random(4), 200, kernels=40, submitters=10))
    with Store.open(tmp_path, fsync=False) as store:
        store.emit(*events)
        store.snapshot()
    expected = everything(tmp_path)
    path = history_path(tmp_path)
    for suffix in ("-wal", "-shm"):
        assert not os.path.exists(f"{path}{suffix}") or suffix  # closed cleanly
    if damage == "missing":
        path.unlink()
    elif damage == "garbage":
        path.write_bytes(b"not a database" * 100)
    elif damage == "another log":
        with Store.open(tmp_path / "other", fsync=False) as other:
            other.emit(*rejected("x1"))
        os.replace(history_path(tmp_path / "other"), path)
    else:
        import sqlite3
        db = sqlite3.connect(path)
        with db:
            db.execute("UPDATE meta SET value = '0' WHERE key = 'layout'")
        db.close()
    with Store.open(tmp_path, fsync=False) as store:
        assert store.report["history"]["rebuilt"] is not None
        assert store.report["snapshot_seq"] is None  # a snapshot newer than the projection is not used
        assert {u: store.submission(u) for u in expected} == expected
        assert store.history.count() == sum(1 for s in expected.values() if s.status in
                                            ("accepted", "rejected", "failed", "cancelled", "revoked"))
    assert verify_history(tmp_path)[1] == []


CHILD = textwrap.dedent("""
    import random, sys
    from kz_events.log.store import Store
    from kz_events.read.workload import history
    store = Store.open(sys.argv[1], snapshot_every=int(sys.argv[2]))
    print("OPEN", store.state.seq, flush=True)
    events = list(history(random.Random(int(sys.argv[3])), 4000, kernels=200, submitters=30))
    for i in range(store.state.seq, len(events), 7):
        seqs = store.emit(*events[i:i + 7])
        print("ACK", seqs[-1], flush=True)
""")


def test_sigkill_leaves_the_projection_exactly_consistent_with_the_log(tmp_path):
    """Killed while emitting, writing the projection and taking snapshots: each reopen is exact."""
    rng = random.Random(77)
    acked = 0
    for _ in range(4):
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), "400", "5"],
                                stdout=subprocess.PIPE, text=True)
        deadline = None
        for line in proc.stdout:
            if line.startswith("ACK"):
                acked = int(line.split()[1])
                deadline = deadline or time.monotonic() + rng.uniform(0.5, 2.0)
            if deadline is not None and time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with Store.open(tmp_path) as store:
            assert store.state.seq >= acked
            seq, diffs = verify_history(tmp_path)
            assert diffs == [] and seq == store.state.seq, diffs
            expected = everything(tmp_path)
            assert store.history.count() + len(store.state.submissions) == len(expected)
    assert list_snapshots(tmp_path)  # snapshots were taken between kills


def test_a_read_only_view_sees_what_the_store_sees(tmp_path):
    events = list(history(random.Random(6), 150, kernels=30, submitters=8))
    with Store.open(tmp_path, fsync=False) as store:
        store.emit(*events[:len(events) // 2])
        store.snapshot()
        store.emit(*events[len(events) // 2:])
        store.flush_history()
        expected = everything(tmp_path)
        with open_view(tmp_path) as view:  # beside the running store
            assert {u: view.submission(u) for u in expected} == expected
            assert [s.uuid for s in view.select(Query(), limit=20)] == \
                [s.uuid for s in store.select(Query(), limit=20)]
            some = next(iter(expected))
            assert some in view.uuids(some[:3])


def test_build_history_writes_a_log_the_store_accepts_with_a_realistic_mix(tmp_path):
    summary = build_history(tmp_path, 400, seed=3, kernels=60, submitters=15)
    by_status = summary["by_status"]
    assert summary["submissions"] == 400
    assert {"accepted", "rejected", "revoked"} <= set(by_status) and summary["live"] < 400
    state, finished = replay_finished(tmp_path)  # every line read back and accepted
    assert state.seq == summary["seq"] and len(finished) == 400 - summary["live"]
    snap = snapshot_dir(tmp_path) / f"{list_snapshots(tmp_path)[-1]:020d}.snap"
    body = marshal.loads(snap.read_bytes().partition(b"\n")[2])
    assert len(body["submissions"]) == summary["live"]
    with History.open(history_path(tmp_path), readonly=True) as history_db:
        assert history_db.count() == 400 - summary["live"]

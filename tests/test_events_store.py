"""The Store and the segment log: durability, group commit, snapshots, repair, locking."""
from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from kz_events import events as E
from kz_events.log.replay import replay_dir
from kz_events.log.segments import CorruptLog, EventLog, LogLocked, list_segments, segment_name
from kz_events.log.snapshot import list_snapshots
from kz_events.log.store import Store, StoreClosed
from kz_events.read.workload import build_log, simulate
from kz_events.reducer import InvalidTransition, apply_record
from kz_events.state import State
from tests.helpers.events import hold_log_appends


def fold(events) -> State:
    state = State()
    for ev in events:
        apply_record(state, state.seq + 1, "t", ev.TYPE, ev.payload())
    return state


def received(uuid: str, kid: str = "sm_90/A/x/fp16/k") -> list[E.Event]:
    return [E.SubmissionReceived(uuid, kid, "alice", "http", "p.tar.gz", 10, "a" * 64),
            E.JobQueued(uuid, kid, "sm_90")]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 600), batch=st.integers(1, 40),
       segment_bytes=st.sampled_from([2_000, 50_000, 1 << 26]))
def test_replay_equals_the_incremental_state(seed, n, batch, segment_bytes):
    with tempfile.TemporaryDirectory() as tmp:
        events_dir = Path(tmp) / "events"
        incremental = build_log(events_dir, n, seed, batch=batch, segment_bytes=segment_bytes,
                                snapshot_every=0)
        assert incremental.seq == n
        assert replay_dir(events_dir) == incremental
        with Store.open(events_dir, use_snapshots=False, fsync=False) as store:
            assert store.state == incremental
            assert store.report["replayed"] == n


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 400), data=st.data())
def test_replay_equals_the_state_built_by_every_way_of_emitting(seed, n, data):
    """emit, emit_async, and submit with the wait now, later, or never (close commits it)."""

    events = list(simulate(random.Random(seed), n))
    with tempfile.TemporaryDirectory() as tmp:
        events_dir = Path(tmp) / "events"
        store = Store.open(events_dir, segment_bytes=4_000, snapshot_every=0)
        loop = asyncio.new_event_loop()
        unwaited = []
        i = 0
        while i < n:
            size = data.draw(st.integers(1, 12), label="batch")
            batch = events[i:i + size]
            i += len(batch)
            how = data.draw(st.sampled_from(["emit", "emit_async", "submit", "submit_later"]), label="how")
            if how == "emit":
                seqs = store.emit(*batch)
            elif how == "emit_async":
                seqs = loop.run_until_complete(store.emit_async(*batch))
            else:
                ticket = store.submit(*batch)
                seqs = ticket.seqs
                if how == "submit":
                    assert ticket.wait() == seqs
                else:
                    unwaited.append(ticket)
            assert seqs == list(range(i - len(batch) + 1, i + 1))
        for ticket in unwaited[:len(unwaited) // 2]:  # some waited for late, the rest never
            ticket.wait()
        incremental = store.state.copy()
        store.close()
        loop.close()
        assert incremental.seq == n
        assert replay_dir(events_dir) == incremental


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 500), data=st.data())
def test_snapshot_plus_tail_equals_full_replay(seed, n, data):
    k = data.draw(st.integers(0, n))
    events = list(simulate(random.Random(seed), n))
    with tempfile.TemporaryDirectory() as tmp:
        events_dir = Path(tmp) / "events"
        with Store.open(events_dir, fsync=False, segment_bytes=3_000, snapshot_every=0) as store:
            if k:
                store.emit(*events[:k])
            store.snapshot()
            if k < n:
                store.emit(*events[k:])
            live = store.state
        with Store.open(events_dir, fsync=False) as store:
            assert store.report["snapshot_seq"] == k
            assert store.report["replayed"] == n - k
            assert store.state == live == replay_dir(events_dir)


def test_snapshot_of_an_older_reducer_version_is_ignored(tmp_path):
    events_dir = tmp_path / "events"
    state = build_log(events_dir, 300, 1)
    with Store.open(events_dir, fsync=False) as store:
        path = store.snapshot()
    header, _, body = path.read_bytes().partition(b"\n")
    doc = json.loads(header)
    doc["reducer_version"] = 0
    path.write_bytes(json.dumps(doc).encode() + b"\n" + body)
    with Store.open(events_dir, fsync=False) as store:
        assert store.report["snapshot_seq"] is None and store.report["replayed"] == 300
        assert "reducer version 0" in " ".join(store.report["notes"])
        assert store.state == state


def test_damaged_or_stale_snapshots_fall_back_to_replay(tmp_path):
    events_dir = tmp_path / "events"
    state = build_log(events_dir, 200, 2)
    with Store.open(events_dir, fsync=False) as store:
        path = store.snapshot()
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01
    path.write_bytes(bytes(data))
    with Store.open(events_dir, fsync=False) as store:
        assert store.report["snapshot_seq"] is None and store.state == state
        assert any("checksum" in note for note in store.report["notes"])
    # a snapshot that claims a line the log does not hold (another log) is ignored
    other = tmp_path / "other"
    build_log(other, 250, 3)
    with Store.open(other, fsync=False) as store:
        foreign = store.snapshot()
    shutil.copy(foreign, events_dir / "snapshots" / foreign.name)
    with Store.open(events_dir, fsync=False) as store:
        assert store.report["snapshot_seq"] is None and store.state == state


def _last_line_start(path: Path) -> int:
    data = path.read_bytes()
    return data.rfind(b"\n", 0, len(data) - 1) + 1


def _state_without_last_line(events_dir: Path, segment: Path, original: bytes,
                             start: int) -> State:
    segment.write_bytes(original[:start])
    state = replay_dir(events_dir)
    segment.write_bytes(original)
    return state


def _check_truncation(events_dir: Path, original: bytes, segment: Path, cut: int,
                      before_last: State, start: int) -> None:
    segment.write_bytes(original[:cut])
    shutil.rmtree(events_dir / "quarantine", ignore_errors=True)
    with Store.open(events_dir, fsync=False, use_snapshots=False) as store:
        expected = before_last.copy()
        if cut > start:  # torn bytes: cut off, quarantined, recorded as log.repaired
            repair = store.report["repair"]
            assert repair["dropped_bytes"] == cut - start
            assert (events_dir / repair["quarantine_file"]).read_bytes() == original[start:cut]
            apply_record(expected, expected.seq + 1, "t", "log.repaired",
                         {"dropped_bytes": cut - start,
                          "quarantine_file": repair["quarantine_file"]})
        else:
            assert store.report["repair"] is None
        assert store.state == expected


def test_truncating_the_last_event_at_every_byte_offset_recovers_the_previous_event(tmp_path):
    events_dir = tmp_path / "events"
    build_log(events_dir, 60, 4, batch=7)
    segment = events_dir / segment_name(list_segments(events_dir)[-1])
    original = segment.read_bytes()
    start = _last_line_start(segment)
    before_last = _state_without_last_line(events_dir, segment, original, start)
    for cut in range(start, len(original)):
        _check_truncation(events_dir, original, segment, cut, before_last, start)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 200), data=st.data())
def test_truncation_property_over_random_logs(seed, n, data):
    with tempfile.TemporaryDirectory() as tmp:
        events_dir = Path(tmp) / "events"
        build_log(events_dir, n, seed, segment_bytes=4_000)
        segment = events_dir / segment_name(list_segments(events_dir)[-1])
        original = segment.read_bytes()
        start = _last_line_start(segment)
        before_last = _state_without_last_line(events_dir, segment, original, start)
        cut = data.draw(st.integers(start, len(original) - 1))
        _check_truncation(events_dir, original, segment, cut, before_last, start)


@pytest.mark.parametrize("damage", ["flip", "delete", "garbage"])
def test_a_damaged_line_in_the_middle_stops_open_naming_seq_and_offset(tmp_path, damage):
    events_dir = tmp_path / "events"
    build_log(events_dir, 100, 6)
    segment = events_dir / segment_name(1)
    lines = segment.read_bytes().split(b"\n")
    offset = sum(len(line) + 1 for line in lines[:49])  # line of seq 50
    if damage == "flip":
        lines[49] = lines[49].replace(b'"seq":50', b'"seq":50', 1).replace(b"payload", b"paylaod", 1)
    elif damage == "delete":
        del lines[49]
    else:
        lines[49] = b"{not json"
    segment.write_bytes(b"\n".join(lines))
    with pytest.raises(CorruptLog) as info:
        Store.open(events_dir, fsync=False, use_snapshots=False)
    err = info.value
    if damage == "flip":  # the edit itself parses; the next line's link breaks, or the type check
        assert err.seq in (50, 51)
    else:
        assert err.seq == 50 and err.offset == offset
    assert "byte offset" in str(err)
    # the lock was released: the error is repeatable, not a LogLocked
    with pytest.raises(CorruptLog):
        Store.open(events_dir, fsync=False, use_snapshots=False)


def test_a_second_writer_is_refused_with_the_holders_pid(tmp_path):
    events_dir = tmp_path / "events"
    with Store.open(events_dir, fsync=False):
        with pytest.raises(LogLocked, match=f"pid {os.getpid()}"):
            Store.open(events_dir, fsync=False)
        code = ("import sys; from kz_events.log.store import Store\n"
                "from kz_events.log.segments import LogLocked\n"
                "try: Store.open(sys.argv[1])\n"
                "except LogLocked as e: print(e); sys.exit(3)\n")
        proc = subprocess.run([sys.executable, "-c", code, str(events_dir)],
                              capture_output=True, text=True)
        assert proc.returncode == 3 and f"pid {os.getpid()}" in proc.stdout
    with Store.open(events_dir, fsync=False):  # released on close
        pass


def test_concurrent_emitters_share_one_fsync(tmp_path, monkeypatch):
    store = Store.open(tmp_path / "events", snapshot_every=0)
    store.emit(*received("u0"))
    followers = 7
    # hold the first leader until every follower has queued
    batches = hold_log_appends(monkeypatch, lambda: len(store._pending) >= followers)
    results: list[list[int]] = []
    threads = [threading.Thread(target=lambda i=i: results.append(
        store.emit(E.SubmissionReceived(f"u{i}", "k/x", "s", "http", "f", 1, "a" * 64))))
        for i in range(1, followers + 2)]
    threads[0].start()
    while not batches:
        threading.Event().wait(0.001)
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(10)
    assert batches == [1, followers]
    assert sorted(s for r in results for s in r) == list(range(3, 3 + followers + 1))
    store.close()
    assert replay_dir(tmp_path / "events") == store.state


def test_many_threads_emitting_lose_nothing(tmp_path):
    events_dir = tmp_path / "events"
    store = Store.open(events_dir, segment_bytes=5_000)
    seqs: list[int] = []
    lock = threading.Lock()

    def work(t: int) -> None:
        for i in range(40):
            got = store.emit(*received(f"t{t}-{i}", f"k/{t}"))
            with lock:
                seqs.extend(got)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    store.close()
    assert sorted(seqs) == list(range(1, 6 * 40 * 2 + 1))
    assert len(list_segments(events_dir)) > 1
    assert replay_dir(events_dir) == store.state


def test_segments_are_named_by_their_first_seq(tmp_path):
    events_dir = tmp_path / "events"
    build_log(events_dir, 400, 7, segment_bytes=10_000)
    firsts = list_segments(events_dir)
    assert len(firsts) > 3 and firsts[0] == 1
    for first in firsts:
        line = (events_dir / segment_name(first)).read_bytes().split(b"\n", 1)[0]
        assert json.loads(line)["seq"] == first


def test_a_refused_batch_writes_nothing(tmp_path):
    events_dir = tmp_path / "events"
    store = Store.open(events_dir, fsync=False)
    store.emit(*received("u1"))
    size = (events_dir / segment_name(1)).stat().st_size
    before = store.state.copy()
    with pytest.raises(InvalidTransition):
        store.emit(*received("u2"), E.JobClaimed("u2", "r", "L", 1.0, 7))
    with pytest.raises(TypeError):
        store.emit(*received("u3"), "not an event")
    assert store.state == before
    assert (events_dir / segment_name(1)).stat().st_size == size
    assert store.emit(*received("u2")) == [3, 4]
    store.close()
    assert replay_dir(events_dir) == store.state


def test_wait_for_change_wakes_on_a_durable_emit(tmp_path):
    store = Store.open(tmp_path / "events", fsync=False)
    assert store.wait_for_change(0, 0.01) == 0
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(store.wait_for_change(0, 30)))
    waiter.start()
    store.emit(*received("u1"))
    waiter.join(30)
    assert got and got[0] >= 2
    assert store.wait_for_change(5, 0) == 2
    store.close()
    with pytest.raises(StoreClosed):
        store.emit(*received("u2"))


def test_periodic_snapshots_are_written_and_pruned(tmp_path):
    events_dir = tmp_path / "events"
    # snapshots run in the background: which seqs they catch depends on timing
    build_log(events_dir, 500, 8, batch=10, snapshot_every=100, snapshot_keep=2)
    seqs = list_snapshots(events_dir)
    assert 1 <= len(seqs) <= 2 and all(100 <= s <= 500 for s in seqs)
    stale = events_dir / "snapshots" / ".00000000000000000450.snap.tmp"  # a crash mid-write
    stale.write_bytes(b"half a snapshot")
    with Store.open(events_dir, fsync=False) as store:
        assert store.report["snapshot_seq"] == seqs[-1]
        assert store.report["replayed"] == 500 - seqs[-1]
        store.emit(E.DaemonStarted("0.1.0", 7))
        store.snapshot()
    assert list_snapshots(events_dir)[-1] == 501 and not stale.exists()
    assert len(list_snapshots(events_dir)) == 2


def test_timestamps_come_from_the_injected_clock(tmp_path):
    with Store.open(tmp_path / "events", clock=lambda: 1_800_000_000.25, fsync=False) as store:
        store.emit(E.DaemonStarted("0.1.0", 42))
    line = json.loads((tmp_path / "events" / segment_name(1)).read_bytes())
    assert line["ts"] == "2027-01-15T08:00:00.250000Z"
    assert line["prev"] == "0" * 64 and line["seq"] == 1


def test_subject_carries_the_kernel_of_the_submission(tmp_path):
    with Store.open(tmp_path / "events", fsync=False) as store:
        store.emit(*received("u1"), E.JobClaimed("u1", "r", "L", 1.0, 1))
    last = (tmp_path / "events" / segment_name(1)).read_bytes().splitlines()[-1]
    assert json.loads(last)["subject"] == {"submission": "u1", "kernel_id": "sm_90/A/x/fp16/k"}


def test_old_event_versions_are_upcast_when_the_log_is_replayed(tmp_path, monkeypatch):
    from kz_events import codec

    events_dir = tmp_path / "events"
    with Store.open(events_dir, fsync=False) as store:
        store.emit(*received("u1"), *received("u2", "sm_90/B/x/fp16/k"))
    # job.queued becomes v2; v1 lines (already in the log) are lifted by an upcaster
    monkeypatch.setattr(E.JobQueued, "VERSION", 2)
    monkeypatch.setitem(codec.UPCASTERS, ("job.queued", 1), lambda p: {**p, "arch": "gfx928"})
    with Store.open(events_dir, fsync=False, use_snapshots=False) as store:
        assert {s.arch for s in store.state.submissions.values()} == {"gfx928"}
        store.emit(*received("u3", "sm_90/C/x/fp16/k"))  # written as v2, read as is
    state = replay_dir(events_dir)
    assert [state.submissions[u].arch for u in ("u1", "u2", "u3")] == ["gfx928", "gfx928", "sm_90"]
    monkeypatch.delitem(codec.UPCASTERS, ("job.queued", 1))
    with pytest.raises(CorruptLog, match="no upcaster"):
        replay_dir(events_dir)


@pytest.mark.timeout(60)
def test_an_emitter_interrupted_while_waiting_leaves_no_commit_leaderless(tmp_path, monkeypatch):
    from kz_events.log import store as store_module

    class Interrupted(Exception):
        pass

    class FlakyLock:
        """A waiter lock whose blocking wait is interrupted (like KeyboardInterrupt)."""

        def __init__(self, real):
            self.real = real

        def acquire(self, *args):
            raise Interrupted()

        def release(self):
            self.real.release()

    class FlakyWaiter(store_module._Waiter):
        __slots__ = ()

        def __init__(self, last):
            super().__init__(last)
            self.lock = FlakyLock(self.lock)

    store = Store.open(tmp_path / "events", fsync=False)
    real_append = EventLog.append
    leader_in = threading.Event()
    go = threading.Event()

    def slow_append(self, records):
        leader_in.set()
        go.wait(10)
        return real_append(self, records)

    monkeypatch.setattr(EventLog, "append", slow_append)
    leader = threading.Thread(target=lambda: store.emit(*received("u1")))
    leader.start()
    assert leader_in.wait(10)
    monkeypatch.setattr(store_module, "_Waiter", FlakyWaiter)
    with pytest.raises(Interrupted):
        store.emit(*received("u2"))      # queued behind the leader, then interrupted
    monkeypatch.setattr(store_module, "_Waiter", FlakyWaiter.__mro__[1])
    go.set()
    leader.join(10)
    monkeypatch.setattr(EventLog, "append", real_append)
    assert store.emit(*received("u3")) == [5, 6]  # no hang: the commit had a leader
    store.close()
    assert set(replay_dir(tmp_path / "events").submissions) == {"u1", "u2", "u3"}


# --- submit / wait, and coroutines ----------------------------------------------------

def test_coroutines_emitting_share_fsyncs_and_lose_nothing(tmp_path, monkeypatch):
    store = Store.open(tmp_path / "events", snapshot_every=0)
    coroutines = 50
    # the first commit is held until every coroutine waits: the rest must share one more fsync
    batches = hold_log_appends(monkeypatch, lambda: len(store._futures) >= coroutines)

    async def one(i: int) -> list[int]:
        return await store.emit_async(*received(f"c{i}"))

    async def main():
        return await asyncio.gather(*[one(i) for i in range(coroutines)])

    results = asyncio.run(main())
    assert sorted(s for r in results for s in r) == list(range(1, 2 * coroutines + 1))
    assert all(r == [r[0], r[0] + 1] for r in results)
    assert sum(batches) == 2 * coroutines and len(batches) <= 2
    assert store.seq == 2 * coroutines
    store.close()
    assert replay_dir(tmp_path / "events") == store.state


def test_threads_and_coroutines_emitting_together_lose_nothing(tmp_path):
    events_dir = tmp_path / "events"
    store = Store.open(events_dir, segment_bytes=8_000, snapshot_every=0)
    got: list[int] = []
    lock = threading.Lock()

    def thread_work(t: int) -> None:
        for i in range(30):
            seqs = store.emit(*received(f"t{t}-{i}"))
            with lock:
                got.extend(seqs)

    async def coroutine_work(c: int) -> None:
        for i in range(30):
            seqs = await store.emit_async(*received(f"c{c}-{i}"))
            assert store.seq >= seqs[-1]  # durable when the await returns
            got.extend(seqs)

    async def main():
        await asyncio.gather(*[coroutine_work(c) for c in range(8)])

    threads = [threading.Thread(target=thread_work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    asyncio.run(main())
    for t in threads:
        t.join(30)
    store.close()
    assert sorted(got) == list(range(1, 2 * 30 * 12 + 1))
    assert len(list_segments(events_dir)) > 1
    assert replay_dir(events_dir) == store.state


def test_a_submitted_ticket_is_durable_after_wait_and_committed_by_close(tmp_path):
    events_dir = tmp_path / "events"
    store = Store.open(events_dir)
    ticket = store.submit(*received("u1"))
    assert ticket.seqs == [1, 2] and store.state.seq == 2 and store.seq == 0  # folded, not durable
    assert ticket.wait() == [1, 2] and store.seq == 2
    store.submit(*received("u2"))                  # never waited for
    assert store.submit().wait() == []
    store.close()                                  # close commits it
    assert replay_dir(events_dir).seq == 4


def test_emit_async_does_not_block_the_loop_while_another_thread_holds_the_state_lock(tmp_path):
    from tests.helpers.threads import held_in_another_thread

    store = Store.open(tmp_path / "events", fsync=False)

    async def main(release):
        task = asyncio.ensure_future(store.emit_async(*received("u1")))
        for _ in range(20):  # the loop keeps running while the fold waits for the lock
            await asyncio.sleep(0.005)
        assert not task.done()
        release.set()
        return await asyncio.wait_for(task, 20)

    with held_in_another_thread(store.lock) as release:  # like a snapshot being encoded
        assert asyncio.run(main(release)) == [1, 2]
    store.close()


def test_a_cancelled_coroutine_s_events_are_still_committed(tmp_path, monkeypatch):
    store = Store.open(tmp_path / "events", snapshot_every=0)
    gate = threading.Event()
    hold_log_appends(monkeypatch, gate.is_set)

    async def main():
        first = asyncio.ensure_future(store.emit_async(*received("u1")))
        while not store._leading:
            await asyncio.sleep(0.001)
        second = asyncio.ensure_future(store.emit_async(*received("u2")))
        await asyncio.sleep(0.01)
        second.cancel()
        gate.set()
        assert await first == [1, 2]
        with pytest.raises(asyncio.CancelledError):
            await second

    asyncio.run(main())
    store.close()
    assert set(replay_dir(tmp_path / "events").submissions) == {"u1", "u2"}

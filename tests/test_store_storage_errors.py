"""kz_events.log.store on a failing disk: a failed commit is rolled back, its emitters get a
StorageError, the state and the log keep only what was acknowledged, and the store
writes again as soon as the disk does. Faults are injected at the log's I/O calls
(``EventLog._write`` and ``os.fdatasync``/``os.ftruncate`` as ``kz_events.log.segments`` calls them);
the store, the reducer and the files are real."""
from __future__ import annotations

import asyncio
import errno
import os
import random
import threading
import time

import pytest

from kz_events import events as E
from kz_events.codec import GENESIS, line_hash
from kz_events.log import segments as log_module
from kz_events.log.replay import replay_dir
from kz_events.log.segments import EventLog, list_segments, segment_name
from kz_events.log.store import StorageError, Store, StoreBroken
from kz_events.read.audit import verify_log
from tests.helpers.events import hold_log_appends


def received(uuid: str, kid: str = "sm_90/A/x/fp16/k") -> list[E.Event]:
    return [E.SubmissionReceived(uuid, kid, "alice", "http", "p.tar.gz", 10, "a" * 64),
            E.JobQueued(uuid, kid, "sm_90")]


class Disk:
    """The log's writes and fsyncs, failing with ``errno`` while ``full`` is set.

    A failing write first writes half of its bytes, as a real short write before
    ENOSPC does, so the rollback has something to cut off.
    """

    def __init__(self, monkeypatch, error: int = errno.ENOSPC, *, fail_syncs: bool = False):
        self.full = False
        self.error = error
        self.writes = self.failed = 0
        real_write = EventLog._write
        real_sync = os.fdatasync

        def write(fd: int, parts: list[bytes]) -> None:
            self.writes += 1
            if self.full and not fail_syncs:
                data = b"".join(parts)
                os.write(fd, data[:len(data) // 2])
                self.failed += 1
                raise OSError(self.error, os.strerror(self.error))
            real_write(fd, parts)

        def sync(fd: int) -> None:
            if self.full and fail_syncs:
                self.failed += 1
                raise OSError(self.error, os.strerror(self.error))
            real_sync(fd)

        monkeypatch.setattr(EventLog, "_write", staticmethod(write))
        monkeypatch.setattr(log_module.os, "fdatasync", sync)


def _log_bytes(events_dir) -> dict[str, bytes]:
    return {segment_name(s): (events_dir / segment_name(s)).read_bytes()
            for s in list_segments(events_dir)}


def _assert_log_is_the_state(store: Store) -> None:
    """The files replay to the live state and the chain is intact."""
    assert replay_dir(store.events_dir) == store.state
    assert verify_log(store.events_dir) == []


@pytest.mark.parametrize("fail_syncs, error", [(False, errno.ENOSPC), (True, errno.EIO),
                                               (False, errno.EDQUOT)])
def test_an_emit_on_a_failing_disk_raises_and_the_next_one_succeeds(tmp_path, monkeypatch,
                                                                    fail_syncs, error):
    events_dir = tmp_path / "events"
    store = Store.open(events_dir, snapshot_every=0)
    assert store.emit(*received("u1")) == [1, 2]
    disk = Disk(monkeypatch, error, fail_syncs=fail_syncs)
    before_state, before_files, before_head = store.state.copy(), _log_bytes(events_dir), store.chain_head()

    disk.full = True
    with pytest.raises(StorageError) as info:
        store.emit(*received("u2"))
    assert disk.failed == 1
    assert info.value.errno == error and info.value.full == (error != errno.EIO)
    assert store.state == before_state                 # the fold of u2 is undone
    assert _log_bytes(events_dir) == before_files      # nothing beyond the durable prefix
    assert store.chain_head() == before_head and store.seq == 2
    with pytest.raises(StorageError):                  # still failing: still refused, still clean
        store.emit(*received("u3"))
    assert store.state == before_state and _log_bytes(events_dir) == before_files

    disk.full = False
    assert store.emit(*received("u4")) == [3, 4]       # seqs go on from the durable prefix
    assert set(store.state.submissions) == {"u1", "u4"}
    _assert_log_is_the_state(store)
    store.close()
    with Store.open(events_dir) as reopened:
        assert reopened.state == store.state and reopened.report["repair"] is None


def test_a_failure_after_a_segment_rotation_removes_the_new_segment(tmp_path, monkeypatch):
    events_dir = tmp_path / "events"
    store = Store.open(events_dir, snapshot_every=0, segment_bytes=2000)
    for i in range(4):
        store.emit(*received(f"a{i}"))
    disk = Disk(monkeypatch)
    segments, files, state = list_segments(events_dir), _log_bytes(events_dir), store.state.copy()
    real_write = EventLog._write

    def fail_in_the_new_segment(fd, parts):  # the old segment's part is written and fsynced
        if disk.writes >= 1:
            disk.full = True
        real_write(fd, parts)

    monkeypatch.setattr(EventLog, "_write", staticmethod(fail_in_the_new_segment))
    with pytest.raises(StorageError):
        store.emit(*[ev for i in range(20) for ev in received(f"b{i}")])
    assert list_segments(events_dir) == segments and _log_bytes(events_dir) == files
    assert store.state == state
    disk.full = False
    monkeypatch.setattr(EventLog, "_write", staticmethod(real_write))
    store.emit(*[ev for i in range(20) for ev in received(f"c{i}")])
    assert len(list_segments(events_dir)) > len(segments)
    _assert_log_is_the_state(store)
    store.close()


def test_every_waiter_of_a_failed_group_commit_gets_the_error(tmp_path, monkeypatch):
    store = Store.open(tmp_path / "events", snapshot_every=0)
    store.emit(*received("u0"))
    disk = Disk(monkeypatch)
    disk.full = True
    n = 8
    hold_log_appends(monkeypatch, lambda: len(store._waiters) >= n - 1)
    outcomes: dict[int, object] = {}

    def emitter(i: int) -> None:
        try:
            outcomes[i] = store.emit(*received(f"u{i + 1}"))
        except StorageError as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=emitter, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(outcomes) == n and all(isinstance(o, StorageError) and o.full
                                      for o in outcomes.values())
    assert set(store.state.submissions) == {"u0"} and store.seq == 2
    disk.full = False
    assert store.emit(*received("u9")) == [3, 4]
    _assert_log_is_the_state(store)
    store.close()


def _flapping(disk: Disk, stop: threading.Event, seed: int) -> threading.Thread:
    """A thread that fills and frees the disk at random moments until ``stop``."""
    rng = random.Random(seed)

    def run() -> None:
        while not stop.is_set():
            disk.full = not disk.full
            time.sleep(rng.uniform(0.0005, 0.004))
        disk.full = False

    return threading.Thread(target=run)


def test_threads_emitting_while_the_disk_fills_and_frees_keep_only_what_was_acknowledged(
        tmp_path, monkeypatch):
    store = Store.open(tmp_path / "events", snapshot_every=0)
    disk = Disk(monkeypatch)
    stop = threading.Event()
    acked: set[str] = set()
    failed: set[str] = set()
    record = threading.Lock()

    def emitter(t: int) -> None:
        for i in range(60):
            uuid = f"t{t}-{i}"
            try:
                store.emit(*received(uuid, f"sm_90/K{t}/x/fp16/k"))
            except StorageError:
                with record:
                    failed.add(uuid)
            else:
                with record:
                    acked.add(uuid)

    flapper = _flapping(disk, stop, 1)
    flapper.start()
    threads = [threading.Thread(target=emitter, args=(t,)) for t in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    stop.set()
    flapper.join()
    assert acked and failed, "the fault should have hit some emits and spared others"
    assert store.emit(*received("after")) == [store.seq - 1, store.seq]
    assert set(store.state.submissions) == acked | {"after"}
    _assert_log_is_the_state(store)
    store.close()
    assert set(replay_dir(tmp_path / "events").submissions) == acked | {"after"}


def test_coroutines_emitting_while_the_disk_fills_and_frees_keep_only_what_was_acknowledged(
        tmp_path, monkeypatch):
    store = Store.open(tmp_path / "events", snapshot_every=0)
    disk = Disk(monkeypatch)
    stop = threading.Event()

    async def emitter(c: int) -> dict[str, bool]:
        outcome = {}
        for i in range(40):
            uuid = f"c{c}-{i}"
            try:
                await store.emit_async(*received(uuid, f"sm_90/K{c}/x/fp16/k"))
            except StorageError as exc:
                assert exc.full
                outcome[uuid] = False
            else:
                outcome[uuid] = True
        return outcome

    async def main() -> dict[str, bool]:
        results = await asyncio.gather(*[emitter(c) for c in range(24)])
        return {k: v for r in results for k, v in r.items()}

    flapper = _flapping(disk, stop, 2)
    flapper.start()
    try:
        outcome = asyncio.run(main())
    finally:
        stop.set()
        flapper.join()
    acked = {u for u, ok in outcome.items() if ok}
    assert acked and len(acked) < len(outcome)
    assert set(store.state.submissions) == acked
    _assert_log_is_the_state(store)
    assert asyncio.run(store.emit_async(*received("after")))[-1] == store.seq
    store.close()
    assert set(replay_dir(tmp_path / "events").submissions) == acked | {"after"}


def test_a_rollback_that_fails_too_breaks_the_store(tmp_path, monkeypatch):
    events_dir = tmp_path / "events"
    store = Store.open(events_dir, snapshot_every=0)
    store.emit(*received("u1"))
    disk = Disk(monkeypatch)
    disk.full = True

    def no_truncate(fd, length):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(log_module.os, "ftruncate", no_truncate)
    with pytest.raises(StoreBroken):
        store.emit(*received("u2"))
    health = store.health()
    assert health["broken"] and not health["ok"]
    assert health["last_error"]["code"] == "RollbackFailed"
    monkeypatch.undo()
    with pytest.raises(StoreBroken):  # not even once the disk is back: the file's end is unknown
        store.emit(*received("u3"))
    store.close()
    with Store.open(events_dir) as reopened:  # the disk is the truth: the torn half line is cut
        assert reopened.report["repair"] is not None
        assert set(reopened.state.submissions) == {"u1"}


def test_health_reports_the_last_error_until_a_commit_succeeds(tmp_path, monkeypatch):
    clock = iter(range(1_800_000_000, 1_800_001_000)).__next__
    store = Store.open(tmp_path / "events", clock=lambda: float(clock()), snapshot_every=0)
    assert store.health() == {"ok": True, "broken": False, "closed": False, "seq": 0,
                              "failures": 0, "last_error": None,
                              "history": {"seq": 0, "error": None}}
    store.emit(*received("u1"))
    disk = Disk(monkeypatch)
    disk.full = True
    with pytest.raises(StorageError):
        store.emit(*received("u2"))
    health = store.health()
    assert not health["ok"] and not health["broken"] and health["failures"] == 1
    error = health["last_error"]
    assert error["code"] == "ENOSPC" and error["errno"] == errno.ENOSPC and error["full"]
    assert "No space left" in error["message"] and error["at"].startswith("2027-01-15T")
    disk.full = False
    store.emit(*received("u3"))
    health = store.health()
    assert health["ok"] and health["seq"] == 4 and health["last_error"]["code"] == "ENOSPC"
    store.close()
    assert store.health()["closed"] and not store.health()["ok"]


def test_the_chain_head_is_the_prev_of_the_next_line(tmp_path):
    events_dir = tmp_path / "events"
    store = Store.open(events_dir, snapshot_every=0)
    assert store.chain_head() == (0, GENESIS)
    store.emit(*received("u1"))
    seq, head = store.chain_head()
    lines = (events_dir / segment_name(1)).read_bytes().splitlines()
    assert seq == 2 and head == line_hash(lines[-1])
    store.emit(*received("u2"))
    lines = (events_dir / segment_name(1)).read_bytes().splitlines()
    assert f'"prev":"{head}"'.encode() in lines[2]
    store.close()
    with Store.open(events_dir) as reopened:
        assert reopened.chain_head() == (4, line_hash(lines[-1]))

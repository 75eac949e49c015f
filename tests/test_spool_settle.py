"""The inbox's settle check and its non-regular entries.

A file written in place into ``inbox/`` (not via ``tmp/`` and a rename) waits while
its writer holds it open, so a half-written tarball is never judged; directories,
fifos, symlinks and sockets are left alone with one ``spool.skipped`` event each.
"""
from __future__ import annotations

import json
import os
import socket
import time

import pytest

from kz_daemon.intake import spool
from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from kz_events.status import Status
from tests.helpers.daemon import EXAMPLES, axpy_tarball, wait_for
from tests.helpers.submissions import every


@pytest.fixture
def zoo(tmp_path):
    state = tmp_path / "kz"
    state.mkdir()
    # a long rescan period: the test drives the scans itself
    (state / "kz.yaml").write_text("intake:\n  rescan_interval_s: 3600\n")
    z = Zoo(init_state_dir(state, seed_from=EXAMPLES))
    z.start()
    yield z
    z.stop()


def _events_from_files(zoo):
    out = []
    for seg in sorted(zoo.config.paths.events.glob("*.jsonl")):
        for line in seg.read_bytes().splitlines():
            doc = json.loads(line)
            if doc["type"] == "spool.skipped":
                out.append((doc["payload"]["name"], doc["payload"]["reason"]))
    return out


def test_a_file_written_in_place_waits_for_its_writer(zoo):
    data = axpy_tarball()
    target = zoo.config.spool_inbox / "inplace.tar.gz"
    with open(target, "wb") as out:
        out.write(data[: len(data) // 2])
        out.flush()
        os.utime(target, (time.time() - 60, time.time() - 60))  # older than any quiet period
        zoo.scan_inbox()
        assert every(zoo.store) == {}, "a half-written file was claimed"
        assert target.exists() and zoo.intake.unsettled == 1
        out.write(data[len(data) // 2:])
    zoo.scan_inbox()
    (sub,) = wait_for(lambda: list(every(zoo.store).values()))
    view = zoo.wait_intake(sub.uuid, 30)
    assert view.status == Status.QUEUED, view.reasons


def test_without_a_lease_a_recent_file_waits_for_quiet(tmp_path, monkeypatch):
    path = tmp_path / "f.tar.gz"
    path.write_bytes(b"x")
    monkeypatch.setattr(spool, "open_for_writing", lambda p: None)  # a file system without leases
    now = time.time()
    os.utime(path, (now, now))
    assert not spool.settled(path, now, quiet_s=2.0)
    assert spool.settled(path, now + 2.5, quiet_s=2.0)


def test_the_wait_is_bounded(tmp_path):
    path = tmp_path / "f.tar.gz"
    with open(path, "wb") as out:
        out.write(b"x")
        out.flush()
        now = time.time()
        assert spool.open_for_writing(path) is True
        assert not spool.settled(path, now, max_wait_s=600)
        assert spool.settled(path, now + 601, max_wait_s=600)
    assert spool.open_for_writing(path) is False


def test_non_regular_entries_are_skipped_once_each(zoo, tmp_path):
    inbox = zoo.config.spool_inbox
    (inbox / "adir.tar.gz").mkdir()
    os.mkfifo(inbox / "pipe.tar.gz")
    secret = tmp_path / "secret.tar.gz"
    secret.write_bytes(axpy_tarball())
    os.symlink(secret, inbox / "link.tar.gz")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(inbox / "sock.tar.gz"))
    try:
        zoo.scan_inbox()
        zoo.scan_inbox()
    finally:
        sock.close()
    assert every(zoo.store) == {}
    expected = [("adir.tar.gz", "directory"), ("link.tar.gz", "symlink"),
                ("pipe.tar.gz", "fifo"), ("sock.tar.gz", "socket")]
    # the intake thread may be the one logging an entry: wait for its append, then count
    wait_for(lambda: len(_events_from_files(zoo)) >= len(expected))
    zoo.scan_inbox()
    assert sorted(_events_from_files(zoo)) == expected
    for name in ("adir.tar.gz", "pipe.tar.gz", "link.tar.gz", "sock.tar.gz"):
        assert os.path.lexists(inbox / name), f"{name} was moved"


def test_concurrent_scans_never_claim_one_file_twice(zoo):
    """The intake thread and callers of ``Zoo.scan_inbox`` take turns: no scan reads a file another moved."""
    import threading

    from tests.helpers.daemon import drop_into_inbox

    for i in range(12):
        drop_into_inbox(zoo.config.paths.spool, f"c{i}.tar.gz",
                        axpy_tarball(mutate=lambda f, i=i: f.__setitem__("src/NOTE", f"{i}".encode())))
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def scan() -> None:
        start.wait()
        try:
            for _ in range(5):
                zoo.scan_inbox()
        except BaseException as exc:  # noqa: BLE001 - the assertion below reports it
            errors.append(exc)

    threads = [threading.Thread(target=scan) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    subs = wait_for(lambda: [s for s in every(zoo.store).values()] if len(
        every(zoo.store)) == 12 else None)
    assert len(subs) == 12

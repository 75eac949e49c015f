"""sd_notify over a real AF_UNIX datagram socket (path and abstract namespace)."""
from __future__ import annotations

import asyncio
import os
import socket
import uuid

import pytest

from kz_daemon.upkeep.sdnotify import Notifier, socket_address


def _receiver(tmp_path, abstract: bool):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = f"@kz-test-{uuid.uuid4().hex}"
    else:
        name = str(tmp_path / "notify.sock")
    sock.bind(socket_address(name))
    sock.settimeout(5)
    return sock, name


@pytest.mark.parametrize("abstract", [False, True])
def test_ready_status_stopping_arrive(tmp_path, abstract):
    sock, name = _receiver(tmp_path, abstract)
    with sock:
        notifier = Notifier({"NOTIFY_SOCKET": name})
        assert notifier.enabled
        assert notifier.ready("serving on http://127.0.0.1:1")
        lines = sock.recv(4096).decode().split("\n")
        assert "READY=1" in lines
        assert "STATUS=serving on http://127.0.0.1:1" in lines
        assert f"MAINPID={os.getpid()}" in lines
        assert notifier.status("3 queued")
        assert sock.recv(4096) == b"STATUS=3 queued"
        assert notifier.stopping()
        assert sock.recv(4096) == b"STOPPING=1"
        notifier.close()


def test_without_socket_everything_is_a_noop():
    notifier = Notifier({})
    assert not notifier.enabled
    assert notifier.ready() is False
    assert notifier.watchdog() is False
    assert notifier.watchdog_interval is None


def test_watchdog_interval_is_half_and_respects_pid():
    assert Notifier({"WATCHDOG_USEC": "4000000"}).watchdog_interval == 2.0
    assert Notifier({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())}).watchdog_interval == 2.0
    assert Notifier({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"}).watchdog_interval is None
    assert Notifier({"WATCHDOG_USEC": "junk"}).watchdog_interval is None


def test_watchdog_loop_pings_from_the_event_loop(tmp_path):
    sock, name = _receiver(tmp_path, abstract=True)
    with sock:
        notifier = Notifier({"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "20000"})

        async def main():
            task = asyncio.create_task(notifier.watchdog_loop())
            got = []
            loop = asyncio.get_running_loop()
            for _ in range(3):
                got.append(await loop.run_in_executor(None, sock.recv, 64))
            task.cancel()
            return got

        assert asyncio.run(main()) == [b"WATCHDOG=1"] * 3


def test_missing_socket_does_not_raise(tmp_path):
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")})
    assert notifier.ready() is False


def test_a_receiver_that_stops_reading_never_blocks_the_sender(tmp_path):
    """A full datagram queue drops pings instead of freezing the daemon's event loop."""
    sock, name = _receiver(tmp_path, abstract=True)
    with sock:
        notifier = Notifier({"NOTIFY_SOCKET": name})
        sent = [notifier.watchdog() for _ in range(5000)]  # far beyond any queue length
        assert sent[0] is True and sent.count(False) > 0
        assert sock.recv(64) == b"WATCHDOG=1"

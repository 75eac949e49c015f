"""Slow and crowding clients cannot hold the daemon's connections or descriptors (kz_daemon/http/guard.py).

A connection that sent half a request head was never closed: about 20,000 of them used
every file descriptor, and a legitimate accept then failed on the git object store with
"Too many open files". Every case here goes over real sockets to a real daemon: a
request head must arrive within ``http.header_timeout_s`` (408, closed), a stalled body
is 408 REQUEST_TIMEOUT, connections beyond the caps are answered 503 and closed at once,
and a legitimate submission is accepted by a real runner while a sustained slowloris
holds every connection it may. The last test runs the daemon as its own process under a
small RLIMIT_NOFILE and floods it from many addresses: connections never take the
descriptors kept for the git writer and the event log.
"""
from __future__ import annotations

import json
import socket
from pathlib import Path

import httpx
import pytest
from test_runner_loop import finish, start_runner

from kz_daemon.config.settings import Config
from kz_daemon.core.errors import ZooError
from tests.helpers.daemon import wait_for
from tests.helpers.http_server import CPU_AXPY, LiveServer
from tests.helpers.slowloris import SlowLoris
from tests.helpers.submissions import every
from tests.helpers.system import RunnerProcess, ZooProcess, submit, tiny_tarball

GUARD = {"header_timeout_s": 2.0, "body_timeout_s": 2.0, "max_connections": 100,
         "max_connections_per_address": 40, "submit_burst": 100}
#: another loopback address: the attacker, told apart from the clients on 127.0.0.1
ATTACKER = "127.0.0.2"


def _read_to_eof(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (a bound of 60 s; the guard closes far sooner)."""
    sock.settimeout(60)
    out = b""
    while True:
        data = sock.recv(65536)
        if not data:
            return out
        out += data


def _answer(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    server = LiveServer.start(tmp_path_factory.mktemp("slow"), kernels=[CPU_AXPY], settings=GUARD)
    yield server
    server.stop()


def _port(server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def test_half_a_head_or_nothing_at_all_is_answered_408_and_closed(live):
    half = socket.create_connection(("127.0.0.1", _port(live)))
    half.sendall(b"GET /healthz HTTP/1.1\r\nHost: zoo\r\nAcc")
    silent = socket.create_connection(("127.0.0.1", _port(live)))
    for sock in (half, silent):
        with sock:
            status, body = _answer(_read_to_eof(sock))
        assert status == 408 and body["error"]["code"] == "REQUEST_TIMEOUT"


def test_a_kept_alive_connection_whose_next_head_stalls_is_closed(live):
    with socket.create_connection(("127.0.0.1", _port(live))) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: zoo\r\n\r\n")
        first = sock.makefile("rb")
        assert first.readline().startswith(b"HTTP/1.1 200")
        length = 0
        while (line := first.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        assert json.loads(first.read(length))["status"] == "ok"  # the answer, read whole
        sock.sendall(b"GET /readyz HTTP/1.1\r\nHo")  # the next request, cut short
        status, body = _answer(_read_to_eof(sock))
    assert status == 408 and body["error"]["code"] == "REQUEST_TIMEOUT"


def test_a_stalled_upload_body_is_408_and_nothing_is_recorded(live):
    before = len(every(live.zoo.store))
    head = (b"POST /api/submissions HTTP/1.1\r\nHost: zoo\r\nX-Submitter-Id: carol\r\n"
            b"Content-Type: multipart/form-data; boundary=kzb\r\nContent-Length: 100000\r\n\r\n")
    with socket.create_connection(("127.0.0.1", _port(live))) as sock:
        sock.sendall(head + b"--kzb\r\nContent-Disposition: form-data; name=\"kernel_id\"\r\n\r\ncpu/El")
        status, body = _answer(_read_to_eof(sock))  # read to EOF: the server closed it
    assert status == 408 and body["error"]["code"] == "REQUEST_TIMEOUT"
    assert body["error"]["details"]["body_timeout_s"] == GUARD["body_timeout_s"]
    assert len(every(live.zoo.store)) == before
    assert not list((live.state_dir / "spool" / "inbox").iterdir())


def test_a_sustained_slowloris_cannot_keep_a_submission_out(live, tmp_path):
    seen = {"open": 0, "attacker": 0}

    def sample() -> None:  # the connections the server serves (a refused one is never counted in)
        guard = live.app.state.connection_guard
        seen["open"] = max(seen["open"], guard.open)
        seen["attacker"] = max(seen["attacker"], guard.by_address.get(ATTACKER, 0))

    attack = SlowLoris("127.0.0.1", _port(live), [ATTACKER], per_address=60, sample=sample)
    attack.start()
    try:
        wait_for(lambda: attack.statuses["503"] > 0, timeout=60)  # the attacker is at its cap
        kernel_id = "cpu/Elementwise/Axpy/fp32/slow_clients"
        with live.client("submitter:alice") as alice:
            resp = live.submit(alice, kernel_id, tiny_tarball(kernel_id))
        assert resp.status_code == 202, resp.text
        code, err = finish(start_runner(live.url, tmp_path / "work", "--once", "--wait", "30",
                                        token=live.tokens["runner:r1"]), timeout=120)
        assert code == 0, err
        with live.client() as anon:
            doc = anon.get(resp.json()["status_url"]).json()
        assert doc["status"] == "accepted", doc
    finally:
        closed_by_server = attack.stop(timeout=30)
    assert closed_by_server, "the server left half-open connections open"
    assert set(attack.statuses) <= {"408", "503"}, attack.statuses
    assert attack.statuses["408"] >= GUARD["max_connections_per_address"]  # held, then timed out
    assert attack.statuses["503"] > 0  # beyond the per-address cap: refused at once
    assert seen["attacker"] == GUARD["max_connections_per_address"] and seen["open"] <= GUARD["max_connections"]
    wait_for(lambda: not live.server.server_state.connections, timeout=30)  # uvicorn holds none of them
    with live.client() as anon:
        assert anon.get("/readyz").status_code == 200


def test_the_guard_settings_are_checked(tmp_path):
    config = Config.from_dict({"http": {"header_timeout_s": 5, "max_connections": 10, "fd_reserve": 0}}, tmp_path)
    assert (config.http.header_timeout_s, config.http.max_connections, config.http.fd_reserve) == (5.0, 10, 0)
    for key, value in (("header_timeout_s", 0), ("body_timeout_s", -1), ("max_connections", 0),
                       ("max_connections_per_address", 0), ("keep_alive_s", 0), ("fd_reserve", -1)):
        with pytest.raises(ZooError) as err:
            Config.from_dict({"http": {key: value}}, tmp_path)
        assert err.value.code == "CONFIG_INVALID" and err.value.details["key"] == f"http.{key}"


#: the daemon below gets this many file descriptors, and keeps this many of them from connections
NOFILE, RESERVE = 256, 96


@pytest.mark.slow
def test_a_flood_from_many_addresses_never_takes_the_reserved_descriptors(tmp_path):
    zoo = ZooProcess(tmp_path / "state", runners=("r1",), nofile=NOFILE)
    config = (zoo.state_dir / "kz.yaml").read_text()
    (zoo.state_dir / "kz.yaml").write_text(config.replace(
        "http:\n", f"http:\n  header_timeout_s: 3\n  max_connections: 100000\n"
                   f"  max_connections_per_address: 100000\n  fd_reserve: {RESERVE}\n", 1))
    zoo.start()
    highest = {"fds": 0}

    def sample() -> None:
        highest["fds"] = max(highest["fds"], zoo.open_fds() or 0)

    attackers = [f"127.0.0.{i}" for i in range(2, 10)]  # 8 addresses x 60: far more than 256 descriptors
    attack = SlowLoris("127.0.0.1", zoo.port, attackers, per_address=60, sample=sample)
    runner = None
    try:
        attack.start()
        wait_for(lambda: attack.statuses["503"] >= 100, timeout=150)  # a bound: a loaded CI host is slow to open them
        assert zoo.proc.poll() is None, zoo.log_tail()
        assert highest["fds"] <= NOFILE - RESERVE // 2, highest  # connections stayed out of the reserve
        assert attack.stop(timeout=30) and set(attack.statuses) <= {"408", "503"}, attack.statuses
        # the flood is over: a legitimate submission goes through on the real CPU lane
        kernel_id = "cpu/Elementwise/Axpy/fp32/after_flood"
        resp = submit(zoo.url, kernel_id, tiny_tarball(kernel_id))
        assert resp.status_code == 202, resp.text
        runner = RunnerProcess(zoo, "r1", tmp_path / "runner")
        uuid = resp.json()["uuid"]

        def terminal():
            doc = httpx.get(f"{zoo.url}/api/submissions/{uuid}/status", params={"wait": 10}, timeout=40).json()
            return doc if doc["terminal"] else None
        doc = wait_for(terminal, timeout=120, interval=0.1)
        assert doc["status"] == "accepted", doc
    finally:
        attack.stop(timeout=10)
        if runner is not None:
            runner.stop()
        zoo.stop()
    log = Path(zoo.logs[-1]).read_text(errors="replace")
    assert "Too many open files" not in log and "EMFILE" not in log, log[-3000:]

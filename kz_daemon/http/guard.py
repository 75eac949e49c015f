"""Slow and crowding clients: a deadline for each request head and body, connection caps, descriptors kept.

uvicorn closes an idle keep-alive connection, but never one that sent part of a request
head, nor one that connected and sent nothing: about 20,000 such connections used every
file descriptor of the daemon, and an accept then failed on its git object store
("Too many open files"). Three guards, set in kz.yaml's ``http:`` section:

- :func:`protocol_class` gives uvicorn an HTTP protocol (its h11 one) that answers
  ``408`` and closes a connection whose request head is not complete within
  ``header_timeout_s`` (from the connection, or from the first byte of a later request
  on a kept-alive connection), and that answers ``503`` and closes at once a connection
  beyond ``max_connections``, beyond ``max_connections_per_address`` from one client
  address (the TCP peer; trusted proxies count toward the first cap only), or accepted
  while the process has fewer than ``fd_reserve`` descriptors left.
- :class:`BodyDeadline` (ASGI) gives up on a request body when the client sends no byte
  for ``body_timeout_s`` while a handler waits for it: ``408 REQUEST_TIMEOUT`` and the
  connection closed. Time the server itself spends before reading is not counted.
- :func:`raise_fd_limit` lifts the soft ``RLIMIT_NOFILE`` to the hard one at start, and
  the connection cap is kept to half of what is left after ``fd_reserve`` (an upload holds
  a spooled file besides its socket), so the git writer, the event log and the spool
  always find descriptors. The listen backlog (:func:`accept_backlog`) bounds how many
  sockets are accepted in one go before the first can be refused.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import resource
from collections import Counter
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from kz_daemon.core.errors import ZooError

#: descriptors one connection may hold: its socket and an upload's spooled file
FDS_PER_CONNECTION = 2


def accept_backlog(fd_reserve: int) -> int:
    """The listen backlog: asyncio accepts up to this many sockets in one go before any is refused.

    A burst of connections is accepted (each an open descriptor) before the first of them
    can be counted and refused, for a pass or two of the event loop; a backlog of a
    quarter of the reserve keeps that burst inside it.
    """
    return max(8, fd_reserve // 4)


def raise_fd_limit() -> int:
    """Lift the soft RLIMIT_NOFILE to the hard limit (where allowed); the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass  # a platform that refuses: the cap below follows the limit we have
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def _raw_error(status: int, reason: str, code: str, message: str) -> bytes:
    """A complete HTTP/1.1 error answer with the API's error body, written before closing."""
    body = json.dumps({"error": {"code": code, "message": message, "details": {}}}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n" + ("retry-after: 1\r\n" if status == 503 else "") + "\r\n")
    return head.encode("ascii") + body


HEAD_TIMEOUT = _raw_error(408, "Request Timeout", "REQUEST_TIMEOUT",
                          "the request head did not arrive in time; send the whole request at once")
TOO_MANY = _raw_error(503, "Service Unavailable", "UNAVAILABLE",
                      "too many connections to this server (from this address); retry in a moment")


@dataclass
class ConnectionGuard:
    """The shared state of one server's guarded connections: caps, counts by address, the deadline."""

    header_timeout_s: float
    max_connections: int
    max_per_address: int
    fd_reserve: int
    fd_limit: int
    trusted: tuple = ()

    def __post_init__(self) -> None:
        self.by_address: Counter[str] = Counter()
        self.open = 0
        self.refused = 0

    @property
    def cap(self) -> int:
        """Connections served at once: the configured cap, or what the descriptors left allow."""
        room = max(1, (self.fd_limit - self.fd_reserve) // FDS_PER_CONNECTION)
        return min(self.max_connections, room)

    def _trusted(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in net for net in self.trusted)

    def admit(self, host: str, fd: int | None) -> bool:
        """Count a new connection from ``host`` (socket ``fd``) in, or say False to refuse it."""
        low_on_fds = fd is not None and fd >= self.fd_limit - self.fd_reserve  # fds are handed out lowest first
        crowded = self.open >= self.cap
        greedy = self.by_address[host] >= self.max_per_address and not self._trusted(host)
        if low_on_fds or crowded or greedy:
            self.refused += 1
            return False
        self.open += 1
        self.by_address[host] += 1
        return True

    def release(self, host: str) -> None:
        """Count a connection admitted from ``host`` out."""
        self.open -= 1
        self.by_address[host] -= 1
        if self.by_address[host] <= 0:
            del self.by_address[host]


def protocol_class(guard: ConnectionGuard) -> type:
    """uvicorn's h11 protocol with ``guard``'s head deadline and connection caps."""

    class GuardedH11Protocol(H11Protocol):
        """One connection: refused beyond the caps, closed when a request head does not arrive in time."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._kz_host: str | None = None
            self._kz_head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            host = self.client[0] if self.client else "unknown"
            sock = transport.get_extra_info("socket")
            if not guard.admit(host, sock.fileno() if sock is not None else None):
                transport.write(TOO_MANY)
                transport.close()
                return
            self._kz_host = host
            self._kz_arm_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._kz_cancel_head()
            if self._kz_host is not None:
                guard.release(self._kz_host)
                self._kz_host = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._kz_host is None:
                return  # refused: nothing it sends is read
            if self._kz_head_timer is None and (self.cycle is None or self.cycle.response_complete):
                self._kz_arm_head()  # the first bytes of the next request on a kept-alive connection
            before = self.cycle
            super().data_received(data)
            if self.cycle is not before:  # a whole head arrived: a request is under way
                self._kz_cancel_head()

        def _kz_arm_head(self) -> None:
            self._kz_cancel_head()
            self._kz_head_timer = self.loop.call_later(guard.header_timeout_s, self._kz_head_expired)

        def _kz_cancel_head(self) -> None:
            if self._kz_head_timer is not None:
                self._kz_head_timer.cancel()
                self._kz_head_timer = None

        def _kz_head_expired(self) -> None:
            self._kz_head_timer = None
            if self.transport.is_closing() or (self.cycle is not None and not self.cycle.response_complete):
                return
            self.transport.write(HEAD_TIMEOUT)
            self.transport.close()

    return GuardedH11Protocol


class BodyDeadline:
    """ASGI middleware: a request body that stalls for ``timeout_s`` while a handler waits is 408 REQUEST_TIMEOUT.

    Only reads of the body are timed; once it is complete (or the client left), ``receive``
    passes through untouched, so waiting for a disconnect while a response streams is not.
    """

    def __init__(self, app: Any, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = {"done": False, "expired": False}

        async def timed_receive() -> dict:
            if state["done"]:
                return await receive()
            if state["expired"]:
                raise _body_timeout(self.timeout_s)
            try:
                message = await asyncio.wait_for(receive(), self.timeout_s)
            except TimeoutError:
                state["expired"] = True
                raise _body_timeout(self.timeout_s) from None
            if message.get("type") != "http.request" or not message.get("more_body", False):
                state["done"] = True
            return message

        await self.app(scope, timed_receive, send)


def _body_timeout(timeout_s: float) -> ZooError:
    return ZooError("REQUEST_TIMEOUT", f"the request body stalled: no byte arrived for {timeout_s:g} s; "
                    "send it again", {"body_timeout_s": timeout_s})

"""systemd's sd_notify protocol without extra dependencies.

A service started with ``Type=notify`` gets ``NOTIFY_SOCKET`` in its environment:
a path to an ``AF_UNIX`` datagram socket, or an abstract-namespace name written
with a leading ``@``. The daemon sends newline-separated ``KEY=VALUE`` lines:
``READY=1`` once it serves, ``STATUS=...`` for ``systemctl status``,
``WATCHDOG=1`` at least every ``WATCHDOG_USEC`` microseconds (we ping at half
that, from the event loop, so a wedged loop is what the watchdog detects) and
``STOPPING=1`` when shutdown begins. Without ``NOTIFY_SOCKET`` every call is a
no-op, so the same code runs under systemd, in tests and in a terminal.
"""
from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Mapping


def socket_address(value: str) -> str | bytes:
    """The ``connect``/``sendto`` address for a ``NOTIFY_SOCKET`` value.

    ``"@name"`` is Linux's abstract namespace (a leading NUL byte);
    ``"/run/x.sock"`` is a filesystem path.

    >>> socket_address("@kz")
    b'\\x00kz'
    """
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    return value


class Notifier:
    """Sends sd_notify messages to ``NOTIFY_SOCKET``; every method is a no-op without one."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._address = env.get("NOTIFY_SOCKET") or None
        self._watchdog_usec = _watchdog_usec(env)
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        """True when a ``NOTIFY_SOCKET`` was given."""
        return self._address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between ``WATCHDOG=1`` pings (half of ``WATCHDOG_USEC``), or None when off."""
        if self._watchdog_usec is None:
            return None
        return self._watchdog_usec / 2_000_000

    def notify(self, **fields: str | int) -> bool:
        """Send one datagram of ``KEY=VALUE`` lines; returns whether it was sent."""
        if self._address is None:
            return False
        payload = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                # Never block the event loop: when the receiver's queue is full the
                # message is dropped (the next ping follows half a watchdog period later).
                self._sock.setblocking(False)
            self._sock.sendto(payload, socket_address(self._address))
        except OSError:  # BlockingIOError (queue full), no listener, socket gone
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """``READY=1`` (with an optional ``STATUS``)."""
        fields: dict[str, str | int] = {"READY": 1}
        if status:
            fields["STATUS"] = status
        fields["MAINPID"] = os.getpid()
        return self.notify(**fields)

    def status(self, text: str) -> bool:
        """``STATUS=text``."""
        return self.notify(STATUS=text)

    def watchdog(self) -> bool:
        """``WATCHDOG=1``."""
        return self.notify(WATCHDOG=1)

    def stopping(self, status: str | None = None) -> bool:
        """``STOPPING=1`` (with an optional ``STATUS``)."""
        fields: dict[str, str | int] = {"STOPPING": 1}
        if status:
            fields["STATUS"] = status
        return self.notify(**fields)

    async def watchdog_loop(self) -> None:
        """Ping ``WATCHDOG=1`` every half ``WATCHDOG_USEC`` from the running event loop, forever."""
        interval = self.watchdog_interval
        if interval is None or not self.enabled:
            return
        while True:
            self.watchdog()
            await asyncio.sleep(interval)

    def close(self) -> None:
        """Close the socket (a later call reopens it)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _watchdog_usec(env: Mapping[str, str]) -> int | None:
    """``WATCHDOG_USEC`` when set, positive and meant for this process (``WATCHDOG_PID``)."""
    raw = env.get("WATCHDOG_USEC")
    if not raw:
        return None
    try:
        usec = int(raw)
    except ValueError:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    return usec if usec > 0 else None

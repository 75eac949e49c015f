"""Event-log helpers for tests of group commit."""
from __future__ import annotations

import time
from collections.abc import Callable

from kz_events.log.segments import EventLog


def hold_log_appends(monkeypatch, until: Callable[[], bool], *, every: bool = False,
                     timeout: float = 20.0) -> list[int]:
    """Make ``EventLog.append`` (one write + fsync of a batch) wait until ``until()`` is true.

    Only the first append waits, or every one with ``every``; each waits at most
    ``timeout`` seconds. Returns the list the batch sizes are recorded in, in order.
    """
    batches: list[int] = []
    real_append = EventLog.append

    def append(self, records):
        batches.append(len(records))
        if every or len(batches) == 1:
            deadline = time.monotonic() + timeout
            while not until() and time.monotonic() < deadline:
                time.sleep(0.001)
        return real_append(self, records)

    monkeypatch.setattr(EventLog, "append", append)
    return batches

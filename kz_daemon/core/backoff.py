"""Exponential backoff: one formula, and a per-key schedule of retries on an injectable clock.

``compute_backoff(failures, first_s, max_s)`` is the wait after the ``failures``-th
failure in a row: ``first_s`` after the first, doubling each time, never more than
``max_s``. ``Backoff`` keeps, per key (a saga's uuid), when it may be tried again, so a
loop that wakes often (the lease reaper, several times a second) retries each stuck
task ever more rarely instead of at its own pace forever. Pure: the clock is given.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["compute_backoff", "Backoff"]


def compute_backoff(failures: int, first_s: float, max_s: float) -> float:
    """Seconds to wait after ``failures`` failures in a row (0: none, no wait)."""
    if failures <= 0:
        return 0.0
    return min(max_s, first_s * 2.0 ** min(failures - 1, 62))


class Backoff:
    """When each key may be tried again after its failures (thread-safe)."""

    def __init__(self, first_s: float, max_s: float, clock: Callable[[], float]) -> None:
        self.first_s, self.max_s = first_s, max_s
        self.clock = clock
        self._lock = threading.Lock()
        self._keys: dict[str, tuple[int, float]] = {}  # key -> (failures in a row, may retry at)

    def due(self, key: str) -> bool:
        """Whether ``key`` may be tried now (a key that never failed always may)."""
        with self._lock:
            entry = self._keys.get(key)
        return entry is None or self.clock() >= entry[1]

    def failed(self, key: str) -> float:
        """Note a failure of ``key``; the seconds until it may be tried again."""
        now = self.clock()
        with self._lock:
            failures = self._keys.get(key, (0, 0.0))[0] + 1
            wait = compute_backoff(failures, self.first_s, self.max_s)
            self._keys[key] = (failures, now + wait)
        return wait

    def failures(self, key: str) -> int:
        """Failures of ``key`` in a row so far."""
        with self._lock:
            return self._keys.get(key, (0, 0.0))[0]

    def forget(self, key: str) -> None:
        """``key`` succeeded or went away: its next failure starts over."""
        with self._lock:
            self._keys.pop(key, None)

    def keep_only(self, keys: set[str]) -> None:
        """Forget every key not in ``keys`` (those no longer retried)."""
        with self._lock:
            for key in [k for k in self._keys if k not in keys]:
                del self._keys[key]

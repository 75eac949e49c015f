"""Exponential backoff: the one formula every retry loop of the daemon and the runner uses.

``compute_backoff(failures, first_s, max_s)`` is the wait after the ``failures``-th
failure in a row: ``first_s`` after the first, doubling each time, never more than
``max_s``. The lease reaper's saga retries, the mirror pusher, ``kz up``'s runner
supervisor and the runner's HTTP retries (which add their jitter on top) all take
their waits from it. It sits in ``kz_events`` because that is the one package both the
daemon and the runner may import (standard library only).
"""
from __future__ import annotations

__all__ = ["compute_backoff"]


def compute_backoff(failures: int, first_s: float, max_s: float) -> float:
    """Seconds to wait after ``failures`` failures in a row (0: none, no wait)."""
    if failures <= 0:
        return 0.0
    return min(max_s, first_s * 2.0 ** min(failures - 1, 62))

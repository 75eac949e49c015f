"""Wall-clock time as the daemon writes it: UTC RFC 3339 strings from an injectable clock."""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from kz_events.codec import format_ts_seconds

__all__ = ["epoch_of", "iso_at", "iso_now"]


def iso_at(ts: float) -> str:
    """UTC RFC 3339 with seconds for the epoch time ``ts`` (``kz_events.codec.format_ts_seconds``)."""
    return format_ts_seconds(ts)


def iso_now(clock: Callable[[], float]) -> str:
    """UTC RFC 3339 with seconds for ``clock()`` (``time.time`` in the daemon, a fake in tests)."""
    return iso_at(clock())


def epoch_of(ts: str) -> float | None:
    """Epoch seconds of an RFC 3339 ``ts`` as the events carry it (``...Z``); None when unreadable."""
    try:
        return dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except (AttributeError, ValueError):
        return None

"""A measurement's noise: the interval a recorded value carries, and when one value is better beyond it.

A benchmark run reports, for each case's primary metric, ``spread: {n, lo, hi}``: the
number of timed calls and a 95 % confidence interval of the value in the metric's unit
(``kz_runner.bench``; the benchmark_output schema). The scorecard keeps it beside the
value. Two values whose intervals overlap cannot be told apart by these runs, so the
leaderboard neither moves a best between them (:func:`better_beyond_noise`) nor ranks
one above the other (``kz_daemon.board.ranking``). A value without a spread (a record
written before the field, a metric the harness did not time) is its own point interval,
so it compares by value, as it always did. Pure functions over plain values.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Interval", "interval_of", "spread_of", "overlaps", "better_beyond_noise"]

LOWER, HIGHER = "lower_better", "higher_better"


@dataclass(frozen=True)
class Interval:
    """``[lo, hi]`` around a value, with ``n`` the number of timed calls behind it (0: unknown)."""

    value: float
    lo: float
    hi: float
    n: int = 0

    @property
    def exact(self) -> bool:
        """Whether the interval is a point: no spread was recorded."""
        return self.lo == self.hi == self.value

    def scaled(self, factor: float) -> Interval:
        """The interval of ``value * factor`` (``factor`` > 0)."""
        return Interval(self.value * factor, self.lo * factor, self.hi * factor, self.n)

    def inverted(self, numerator: float) -> Interval:
        """The interval of ``numerator / value`` (all positive): the ends swap."""
        return Interval(numerator / self.value, numerator / self.hi, numerator / self.lo, self.n)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def spread_of(raw: Any, value: float) -> dict[str, Any] | None:
    """A clean ``{n, lo, hi}`` from a record's or a metric's ``spread`` (None when absent or malformed).

    The interval is widened to hold ``value`` itself, so a malformed report can only
    make a value look noisier, never more precise than a point.
    """
    if not isinstance(raw, Mapping) or not _number(value):
        return None
    n, lo, hi = raw.get("n"), raw.get("lo"), raw.get("hi")
    if not (isinstance(n, int) and not isinstance(n, bool) and n >= 1):
        return None
    if not (isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and _number(lo) and _number(hi)):
        return None
    low, high = float(lo), float(hi)
    if low > high:
        return None
    return {"n": n, "lo": min(low, float(value)), "hi": max(high, float(value))}


def interval_of(record: Any) -> Interval | None:
    """The interval of a scorecard/index record (``{value, spread?}``) or a bare number; None without a value."""
    if _number(record):
        return Interval(float(record), float(record), float(record))
    if not isinstance(record, Mapping) or not _number(record.get("value")):
        return None
    value = float(record["value"])
    spread = spread_of(record.get("spread"), value)
    if spread is None:
        return Interval(value, value, value)
    return Interval(value, spread["lo"], spread["hi"], spread["n"])


def overlaps(a: Interval, b: Interval) -> bool:
    """Whether two intervals share a point (touching ends count: the runs cannot tell them apart)."""
    return a.lo <= b.hi and b.lo <= a.hi


def better_beyond_noise(new: Interval, old: Interval, direction: str) -> bool:
    """Whether ``new`` is better than ``old`` in ``direction`` by more than the noise of both.

    With both intervals known: the whole of ``new``'s interval lies on the better side of
    ``old``'s (no overlap). With either a point (no spread recorded): strictly better by
    value, the rule from before spreads were recorded.
    """
    if direction not in (LOWER, HIGHER):
        raise ValueError(f"unknown metric direction {direction!r}")
    if new.exact or old.exact:
        return new.value < old.value if direction == LOWER else new.value > old.value
    return new.hi < old.lo if direction == LOWER else new.lo > old.hi

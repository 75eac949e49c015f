"""Speed of light: how close a case's measured figure comes to what the arch can do at most.

The same figures the physics floor bounds results with (``kz_runner.contract.rules.floor``:
the bytes a case moves by ``io_signature`` and its ``params``, the per-arch
:class:`~kz_runner.contract.rules.floor.Ceiling` from kz.yaml's ``physics:`` or the
defaults), read the other way: not "no device can do this" but "this is x % of it".

- A **time** (``lower_better``, s/ms/us/ns): the achieved bandwidth is the case's bytes
  over the time, against the memory it fits in: L2's bandwidth when the bytes fit in
  L2, else HBM's (the floor's choice).
- A **bandwidth** (``higher_better``, GB/s ...): the figure itself, against the same peak.
- A **compute rate** (``higher_better``, TFLOPS ...): the figure against the highest
  peak of the case's dtypes (the floor's cap); no bandwidth (the run reports no time).

The percentages are of the datasheet-class figures without the floor's margin, so an
honest kernel stays at or below 100 %; the interval of the value, when it has one,
maps to an interval of the percentage. A case without a floor (a dim that does not
resolve, an arch without a ceiling, a metric the floor does not read) has no speed of
light: ``None``. Pure functions over values.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kz_daemon.core.noise import Interval
from kz_runner.contract.rules.floor import (
    BANDWIDTH_UNITS,
    COMPUTE_UNITS,
    DEFAULT_CEILINGS,
    TIME_UNITS,
    Ceiling,
    case_bytes,
    metric_kind,
)

__all__ = ["speed_of_light"]


def _pct(achieved: float, peak: float) -> float:
    return round(100.0 * achieved / peak, 3)


def speed_of_light(value: Interval | float | None, unit: Any, direction: Any, params: Mapping[str, Any] | None,
                   io_signature: Any, arch: str,
                   ceilings: Mapping[str, Ceiling] = DEFAULT_CEILINGS) -> dict[str, Any] | None:
    """The achieved figure and its share of the arch's peak for one case's measured ``value``, or None.

    Returns ``{kind, bytes, memory, achieved_bytes_per_s, peak_bytes_per_s, pct_of_peak,
    pct_interval}`` for a time or a bandwidth (``memory``: ``L2`` or ``HBM``), and
    ``{kind, achieved_flops, peak_flops, pct_of_peak, pct_interval}`` for a compute rate.
    """
    if value is None:
        return None
    iv = value if isinstance(value, Interval) else Interval(float(value), float(value), float(value))
    if iv.value <= 0 or iv.lo <= 0:
        return None
    ceiling = ceilings.get(arch)
    kind = metric_kind(unit, direction)
    if ceiling is None or kind is None:
        return None
    unit_key = str(unit).strip().lower()
    moved = case_bytes(io_signature, params if isinstance(params, Mapping) else {})
    if kind == "compute":
        if moved is None:
            return None
        peaks = [ceiling.flops.get(d) for d in moved[1]]
        known = [p for p in peaks if p is not None]
        if not known or len(known) != len(peaks):
            return None
        peak = max(known)
        scale = COMPUTE_UNITS[unit_key]
        return {"kind": kind, "achieved_flops": iv.value * scale, "peak_flops": peak,
                "pct_of_peak": _pct(iv.value * scale, peak),
                "pct_interval": [_pct(iv.lo * scale, peak), _pct(iv.hi * scale, peak)]}
    if moved is None or moved[0] <= 0:
        return None
    nbytes = moved[0]
    in_l2 = nbytes <= ceiling.l2_bytes
    peak = ceiling.l2_bytes_per_s if in_l2 else ceiling.hbm_bytes_per_s
    if kind == "latency":
        seconds = TIME_UNITS[unit_key]
        achieved, lo, hi = nbytes / (iv.value * seconds), nbytes / (iv.hi * seconds), nbytes / (iv.lo * seconds)
    else:
        scale = BANDWIDTH_UNITS[unit_key]
        achieved, lo, hi = iv.value * scale, iv.lo * scale, iv.hi * scale
    return {"kind": kind, "bytes": nbytes, "memory": "L2" if in_l2 else "HBM",
            "achieved_bytes_per_s": achieved, "peak_bytes_per_s": peak,
            "pct_of_peak": _pct(achieved, peak), "pct_interval": [_pct(lo, peak), _pct(hi, peak)]}

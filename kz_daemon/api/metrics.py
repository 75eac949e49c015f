"""Prometheus text exposition of the daemon's counters and the shim's own request counts.

``zoo.metrics()`` returns a mapping; numbers become gauges ``kz_<name>``, mappings of
numbers become one labelled family, and a mapping with ``buckets`` (upper bound →
cumulative count), ``sum`` and ``count`` becomes a histogram.
"""
from __future__ import annotations

import math
import re
import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

from kz_daemon.core.clock import epoch_of
from kz_events.log.history import ACCEPT_LATENCY_BOUNDS
from kz_events.state import Submission
from kz_events.status import Status

_NAME_RE = re.compile(r"[^a-zA-Z0-9_]")

#: Label name used for the keys of a mapping of numbers, by family name suffix.
_LABELS = {"by_state": "state", "by_status": "status", "by_arch": "arch", "by_code": "code"}


#: Upper bounds (seconds) of the accept-latency histogram buckets: the history projection's,
#: so the histogram computed here and the one the projection keeps have the same buckets.
LATENCY_BUCKETS = ACCEPT_LATENCY_BOUNDS


def accept_latency(submissions: Mapping[str, Submission]) -> dict[str, Any]:
    """Histogram of received → accepted seconds over the folded submissions (uuid → record).

    Used when ``zoo.metrics()`` does not report ``accept_latency_seconds`` itself;
    it reads only each submission's status history ``[(seq, status, ts), ...]``.
    """
    counts = [0] * len(LATENCY_BUCKETS)
    total, count = 0.0, 0
    for sub in list(submissions.values()):
        if sub.status != Status.ACCEPTED:
            continue
        stamps = {status: ts for _seq, status, ts in sub.history}
        start, end = epoch_of(stamps.get(Status.RECEIVED, "")), epoch_of(stamps.get(Status.ACCEPTED, ""))
        if start is None or end is None:
            continue
        latency = max(0.0, end - start)
        total += latency
        count += 1
        for i, bound in enumerate(LATENCY_BUCKETS):
            if latency <= bound:
                counts[i] += 1  # cumulative: every bucket whose bound it fits under
    return {"buckets": dict(zip(LATENCY_BUCKETS, counts)), "sum": total, "count": count}


class HttpCounters:
    """Requests answered by the shim, by route name and status class (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()

    def add(self, route: str, status: int) -> None:
        """Count one answered request."""
        with self._lock:
            self._counts[(route, f"{status // 100}xx")] += 1

    def snapshot(self) -> dict[tuple[str, str], int]:
        """A copy of the counts."""
        with self._lock:
            return dict(self._counts)


def _metric_name(name: str) -> str:
    name = _NAME_RE.sub("_", name)
    return name if name.startswith("kz_") else f"kz_{name}"


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
        return float(value)
    return None


def _fmt(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    return repr(int(value)) if float(value).is_integer() else repr(value)


def _escape(label: str) -> str:
    return str(label).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_metrics(data: Mapping[str, Any] | None, counters: HttpCounters | None = None) -> str:
    """The Prometheus text for ``data`` (from ``zoo.metrics()``) plus the HTTP request counters."""
    lines: list[str] = []
    data = dict(data or {})
    by_status = data.get("submissions_by_status")
    if isinstance(by_status, Mapping):
        data.setdefault("submissions_accepted_total", by_status.get(Status.ACCEPTED, 0))
        data.setdefault("submissions_rejected_total", by_status.get(Status.REJECTED, 0))
    for key in sorted(data.keys()):
        value = data[key]
        name = _metric_name(key)
        if isinstance(value, Mapping) and "buckets" in value:
            lines.append(f"# TYPE {name} histogram")
            buckets = value.get("buckets") or {}
            items = buckets.items() if isinstance(buckets, Mapping) else buckets
            pairs = sorted(((float(b), float(c)) for b, c in items), key=lambda p: p[0])
            count = float(value.get("count", pairs[-1][1] if pairs else 0))
            for bound, cumulative in pairs:
                if bound != math.inf:
                    lines.append(f'{name}_bucket{{le="{_fmt(bound)}"}} {_fmt(cumulative)}')
            lines.append(f'{name}_bucket{{le="+Inf"}} {_fmt(count)}')
            lines.append(f"{name}_sum {_fmt(float(value.get('sum', 0.0)))}")
            lines.append(f"{name}_count {_fmt(count)}")
        elif isinstance(value, Mapping):
            label = next((v for k, v in _LABELS.items() if key.endswith(k)), "key")
            kind = "counter" if key.endswith("_total") else "gauge"
            lines.append(f"# TYPE {name} {kind}")
            for sub in sorted(value):
                number = _number(value[sub])
                if number is not None:
                    lines.append(f'{name}{{{label}="{_escape(sub)}"}} {_fmt(number)}')
        else:
            number = _number(value)
            if number is None:
                continue
            kind = "counter" if key.endswith("_total") else "gauge"
            lines.append(f"# TYPE {name} {kind}")
            lines.append(f"{name} {_fmt(number)}")
    if counters is not None:
        lines.append("# TYPE kz_http_requests_total counter")
        for (route, klass), count in sorted(counters.snapshot().items()):
            lines.append(f'kz_http_requests_total{{route="{_escape(route)}",code="{klass}"}} {count}')
    return "\n".join(lines) + "\n"

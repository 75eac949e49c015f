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

_NAME_RE = re.compile(r"[^a-zA-Z0-9_]")

#: Label name used for the keys of a mapping of numbers, by family name suffix.
_LABELS = {"by_state": "state", "by_status": "status", "by_arch": "arch", "by_code": "code"}


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
    for key in sorted((data or {}).keys()):
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

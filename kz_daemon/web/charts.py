"""Server-side charts: geometry for small SVG line charts, drawn by ``templates/chart.html``.

This module only computes numbers (scales, ticks, pixel positions); the template turns
them into SVG, so every label goes through the template's escaping. A y axis is
logarithmic when the values span more than a decade, so a case's improvements stay
visible when one run was ten times slower than the rest. A chart of several series has
a legend under the plot; ``step`` draws each series as a staircase (a best holds until
the next one), and a point marked ``hollow`` (a revoked record) is drawn as a ring and
left out of its series' line. :func:`time_labels` labels an x axis of epoch seconds.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
#: Values spanning more than this ratio get a log axis.
LOG_SPAN = 10.0


@dataclass(frozen=True)
class Tick:
    """An axis tick: its pixel position and its label."""

    pos: float
    label: str
    anchor: str = "middle"  # SVG text-anchor: the plot's first and last x labels stay inside the chart


@dataclass(frozen=True)
class Mark:
    """One drawn data point: pixel position, tooltip, optional link target."""

    x: float
    y: float
    tip: str
    href: str = ""
    hollow: bool = False  # drawn as a ring and left out of the line (e.g. a revoked record)


@dataclass(frozen=True)
class Series:
    """One line of a chart."""

    label: str
    color: str
    marks: tuple[Mark, ...]
    path: tuple[tuple[float, float], ...] = ()  # the line's corners when they are not the marks (a staircase)

    @property
    def points(self) -> str:
        """The SVG ``points`` attribute of the line (hollow marks are not on it)."""
        corners = self.path or tuple((m.x, m.y) for m in self.marks if not m.hollow)
        return " ".join(f"{x:.1f},{y:.1f}" for x, y in corners)


@dataclass(frozen=True)
class LegendEntry:
    """One series' swatch and label under the plot."""

    x: float
    y: float
    color: str
    label: str


@dataclass(frozen=True)
class Chart:
    """Everything the chart template draws."""

    title: str
    unit: str
    width: int
    height: int
    left: int
    top: int
    plot_w: int
    plot_h: int
    log: bool
    y_ticks: tuple[Tick, ...]
    x_ticks: tuple[Tick, ...]
    series: tuple[Series, ...]
    legend: tuple[LegendEntry, ...] = ()

    @property
    def bottom(self) -> int:
        """Pixel y of the x axis."""
        return self.top + self.plot_h

    @property
    def right(self) -> int:
        """Pixel x of the plot's right edge."""
        return self.left + self.plot_w


def tick_label(value: float) -> str:
    """A short label for an axis value: whole numbers below ten million in full, else 3 significant digits."""
    if value == int(value) and abs(value) < 1e7:
        return f"{value:.0f}"
    return f"{value:.3g}"


def nice_step(span: float, count: int) -> float:
    """A step of 1, 2 or 5 times a power of ten giving about ``count`` intervals over ``span``."""
    raw = span / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * power:
            return factor * power
    return 10 * power


def linear_domain(lo: float, hi: float, count: int = 4) -> tuple[float, float, list[float]]:
    """A rounded ``(low, high, ticks)`` covering ``[lo, hi]`` on a linear axis."""
    if hi == lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    step = nice_step(hi - lo, count)
    low, high = math.floor(lo / step) * step, math.ceil(hi / step) * step
    ticks = [low + i * step for i in range(int(round((high - low) / step)) + 1)]
    return low, high, ticks


def log_domain(lo: float, hi: float) -> tuple[float, float, list[float]]:
    """Whole decades ``(low, high, ticks)`` covering ``[lo, hi]`` (both positive) on a log axis."""
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    if last == first:
        last += 1
    ticks = [10.0 ** e for e in range(first, last + 1)]
    if last - first <= 2:  # few decades: 2 and 5 in between help reading values
        ticks = sorted(t * f for t in ticks[:-1] for f in (1, 2, 5)) + [ticks[-1]]
    return 10.0 ** first, 10.0 ** last, ticks


def wants_log(values: Sequence[float]) -> bool:
    """Whether ``values`` span more than a decade (and are all positive)."""
    return bool(values) and min(values) > 0 and max(values) / min(values) > LOG_SPAN


def _anchor(pos: float, left: float, right: float) -> str:
    """Where an x label hangs from its position: from the left edge ``start``, to the right one ``end``."""
    if pos <= left + 1:
        return "start"
    return "end" if pos >= right - 1 else "middle"


def time_labels(xs: Sequence[float], count: int = 3) -> dict[float, str]:
    """Labels for an x axis of epoch seconds: the first, the last and ``count - 2`` between, UTC.

    Dates when the span is two days or more, else hours and minutes (with seconds under
    ten minutes), so points of one day are told apart.
    """
    if not xs:
        return {}
    lo, hi = min(xs), max(xs)
    span = hi - lo
    fmt = "%Y-%m-%d" if span >= 2 * 86400 else "%m-%d %H:%M" if span >= 600 else "%H:%M:%S"
    positions = [lo] if span == 0 else [lo + span * i / (count - 1) for i in range(count)]
    out: dict[float, str] = {}
    for x in positions:
        text = datetime.fromtimestamp(x, tz=UTC).strftime(fmt)
        if text not in out.values():  # points within one second: one label
            out[x] = text
    return out


LEGEND_ROW = 14
LEGEND_COLUMNS = 2


def line_chart(series: Mapping[str, Sequence[tuple]], *, title: str = "",
               unit: str = "", x_labels: Mapping[float, str] | None = None, width: int = 360,
               height: int = 180, step: bool = False, legend: bool = False) -> Chart | None:
    """A chart of ``{label: [(x, y, tooltip, href[, hollow]), ...]}``, or None when there is nothing to draw.

    ``x_labels`` names the x positions to label (default: the first and last x). ``step``
    draws each line as a staircase that holds its value until the next point and runs on
    to the chart's right end; ``legend`` adds a row of labels per two series under the plot
    (the chart grows to hold them).
    """
    points = [p for pts in series.values() for p in pts]
    if not points:
        return None
    rows = (len(series) + LEGEND_COLUMNS - 1) // LEGEND_COLUMNS if legend else 0
    left, right_pad, top, bottom_pad = 52, 10, 22, 24
    plot_w, plot_h = width - left - right_pad, height - top - bottom_pad
    height += rows * LEGEND_ROW + (6 if rows else 0)
    ys = [float(p[1]) for p in points]
    log = wants_log(ys)
    low, high, y_ticks = log_domain(min(ys), max(ys)) if log else linear_domain(min(ys), max(ys))
    fy = math.log10 if log else float
    span_y = fy(high) - fy(low)
    xs = [float(p[0]) for p in points]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return top + (1 - (fy(y) - fy(low)) / span_y) * plot_h

    drawn = []
    keys = []
    for index, (label, pts) in enumerate(series.items()):
        marks = tuple(Mark(px(float(p[0])), py(float(p[1])), p[2], p[3], bool(p[4]) if len(p) > 4 else False)
                      for p in sorted(pts, key=lambda p: p[0]))
        path: tuple[tuple[float, float], ...] = ()
        if step:
            solid = [m for m in marks if not m.hollow]
            corners: list[tuple[float, float]] = []
            for m in solid:
                if corners:
                    corners.append((m.x, corners[-1][1]))
                corners.append((m.x, m.y))
            if corners:
                corners.append((float(left + plot_w), corners[-1][1]))
            path = tuple(corners)
        color = PALETTE[index % len(PALETTE)]
        drawn.append(Series(str(label), color, marks, path))
        if legend:
            row, column = divmod(index, LEGEND_COLUMNS)
            keys.append(LegendEntry(left + column * plot_w / LEGEND_COLUMNS,
                                    top + plot_h + bottom_pad + 10 + row * LEGEND_ROW, color, str(label)))
    labels = x_labels if x_labels is not None else {min(xs): tick_label(min(xs)), max(xs): tick_label(max(xs))}
    return Chart(title=title, unit=unit, width=width, height=height, left=left, top=top, plot_w=plot_w,
                 plot_h=plot_h, log=log, y_ticks=tuple(Tick(py(t), tick_label(t)) for t in y_ticks),
                 x_ticks=tuple(Tick(px(x), text, _anchor(px(x), left, left + plot_w)) for x, text in labels.items()),
                 series=tuple(drawn),
                 legend=tuple(keys))

"""Server-side charts: geometry for small SVG line charts, drawn by ``templates/chart.html``.

This module only computes numbers (scales, ticks, pixel positions); the template turns
them into SVG, so every label goes through the template's escaping. A y axis is
logarithmic when the values span more than a decade, so a case's improvements stay
visible when one run was ten times slower than the rest.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
#: Values spanning more than this ratio get a log axis.
LOG_SPAN = 10.0


@dataclass(frozen=True)
class Tick:
    """An axis tick: its pixel position and its label."""

    pos: float
    label: str


@dataclass(frozen=True)
class Mark:
    """One drawn data point: pixel position, tooltip, optional link target."""

    x: float
    y: float
    tip: str
    href: str = ""


@dataclass(frozen=True)
class Series:
    """One line of a chart."""

    label: str
    color: str
    marks: tuple[Mark, ...]

    @property
    def points(self) -> str:
        """The SVG ``points`` attribute of the line."""
        return " ".join(f"{m.x:.1f},{m.y:.1f}" for m in self.marks)


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


def line_chart(series: Mapping[str, Sequence[tuple[float, float, str, str]]], *, title: str = "",
               unit: str = "", x_labels: Mapping[float, str] | None = None, width: int = 360,
               height: int = 180) -> Chart | None:
    """A chart of ``{label: [(x, y, tooltip, href), ...]}``, or None when there is nothing to draw.

    ``x_labels`` names the x positions to label (default: the first and last x).
    """
    points = [p for pts in series.values() for p in pts]
    if not points:
        return None
    left, right_pad, top, bottom_pad = 52, 10, 22, 24
    plot_w, plot_h = width - left - right_pad, height - top - bottom_pad
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
    for index, (label, pts) in enumerate(series.items()):
        marks = tuple(Mark(px(float(x)), py(float(y)), tip, href)
                      for x, y, tip, href in sorted(pts, key=lambda p: p[0]))
        drawn.append(Series(str(label), PALETTE[index % len(PALETTE)], marks))
    labels = x_labels if x_labels is not None else {min(xs): tick_label(min(xs)), max(xs): tick_label(max(xs))}
    return Chart(title=title, unit=unit, width=width, height=height, left=left, top=top, plot_w=plot_w,
                 plot_h=plot_h, log=log, y_ticks=tuple(Tick(py(t), tick_label(t)) for t in y_ticks),
                 x_ticks=tuple(Tick(px(x), text) for x, text in labels.items()), series=tuple(drawn))

"""Timing: device events on a GPU, ``perf_counter_ns`` on the CPU, same statistics.

One timed call is: flush the L2 cache (GPU only; a buffer of twice the device's
L2 is overwritten), record a start event, call the function on the next set of
rotating inputs, record an end event. Calls run in batches; after each batch the
statistics are recomputed and the loop stops as soon as the relative standard
error of the mean is under the target (and at least ``min_reps`` ran), or the
time budget or ``max_reps`` is reached. The headline figure is the median.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

from kz_runner.bench import device as _device

# Why the loop stopped (Timing.stop_reason).
STOP_TARGET = "target_rse"
STOP_BUDGET = "budget"
STOP_MAX_REPS = "max_reps"


@dataclass(frozen=True)
class Stats:
    """Summary statistics of a sample of times, all in milliseconds."""

    n: int  # number of timed calls
    median: float  # the headline figure
    mean: float
    stdev: float  # sample standard deviation (n-1); 0 for n < 2
    cv: float  # stdev / mean
    rse: float  # relative standard error of the mean: stdev / sqrt(n) / mean
    min: float
    max: float
    p10: float
    p90: float


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of already sorted values."""
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def summarize(samples_ms: Sequence[float]) -> Stats:
    """Statistics of ``samples_ms`` (at least one value, all finite)."""
    if not samples_ms:
        raise ValueError("summarize needs at least one sample")
    values = sorted(float(v) for v in samples_ms)
    n = len(values)
    mean = math.fsum(values) / n
    if n > 1:
        var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
        stdev = math.sqrt(var)
    else:
        stdev = 0.0
    cv = stdev / mean if mean > 0 else 0.0
    rse = cv / math.sqrt(n) if n > 1 else math.inf
    return Stats(
        n=n,
        median=_percentile(values, 0.5),
        mean=mean,
        stdev=stdev,
        cv=cv,
        rse=rse,
        min=values[0],
        max=values[-1],
        p10=_percentile(values, 0.10),
        p90=_percentile(values, 0.90),
    )


@dataclass(frozen=True)
class Timing:
    """The outcome of :func:`time_fn`: statistics plus how they were obtained."""

    stats: Stats
    device: str  # "gpu" (device events) or "cpu" (perf_counter_ns)
    stop_reason: str  # STOP_TARGET, STOP_BUDGET or STOP_MAX_REPS
    target_rse: float
    warmup_calls: int
    rotations: int  # number of input sets cycled through
    l2_flush_bytes: int  # bytes overwritten before each call (0 on the CPU)
    elapsed_s: float  # wall time of the measuring loop

    @property
    def median_ms(self) -> float:
        """Median time of one call in milliseconds."""
        return self.stats.median

    @property
    def median_us(self) -> float:
        """Median time of one call in microseconds."""
        return self.stats.median * 1e3

    @property
    def median_s(self) -> float:
        """Median time of one call in seconds."""
        return self.stats.median * 1e-3

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (statistics flattened beside the settings); inf rse becomes None."""
        out = asdict(self)
        stats = out.pop("stats")
        if not math.isfinite(stats["rse"]):
            stats["rse"] = None
        out.update(stats)
        return out

    def describe(self) -> str:
        """One log line: median, spread and how many calls."""
        s = self.stats
        return (
            f"median {s.median * 1e3:.3f} us  mean {s.mean * 1e3:.3f} us  cv {s.cv * 100:.2f}%  "
            f"rse {s.rse * 100:.3f}%  p10/p90 {s.p10 * 1e3:.3f}/{s.p90 * 1e3:.3f} us  "
            f"n {s.n} ({self.stop_reason}, {self.device}, {self.rotations} input sets)"
        )


def _normalise_arg_sets(arg_sets: Any) -> list[tuple]:
    if arg_sets is None:
        return [()]
    sets = list(arg_sets)
    if not sets:
        raise ValueError("arg_sets must hold at least one set of arguments")
    return [tuple(s) if isinstance(s, (tuple, list)) else (s,) for s in sets]


class _CpuClock:
    """perf_counter_ns around each call; nothing to flush."""

    name = "cpu"
    flush_bytes = 0

    def sync(self) -> None:
        """Nothing to wait for on the CPU."""

    def batch(self, fn: Callable, arg_sets: list[tuple], start: int, count: int) -> list[float]:
        """Time ``count`` calls starting at input set ``start``; milliseconds per call."""
        out = []
        k = len(arg_sets)
        for i in range(count):
            args = arg_sets[(start + i) % k]
            t0 = time.perf_counter_ns()
            fn(*args)
            t1 = time.perf_counter_ns()
            out.append((t1 - t0) / 1e6)
        return out


class _GpuClock:
    """CuPy events around each call on the current stream, with an L2 flush before it."""

    name = "gpu"

    def __init__(self, cp: Any, flush_l2: bool) -> None:
        self.cp = cp
        self.flush_bytes = 2 * _device.l2_cache_bytes(cp) if flush_l2 else 0
        self._flush = cp.empty(self.flush_bytes, dtype=cp.uint8) if self.flush_bytes else None

    def sync(self) -> None:
        """Wait for the current stream."""
        self.cp.cuda.get_current_stream().synchronize()

    def batch(self, fn: Callable, arg_sets: list[tuple], start: int, count: int) -> list[float]:
        """Flush, then time ``count`` calls with event pairs; one sync at the end; ms per call."""
        cp = self.cp
        events = []
        k = len(arg_sets)
        for i in range(count):
            args = arg_sets[(start + i) % k]
            if self._flush is not None:
                self._flush.fill(i & 0xFF)
            begin, end = cp.cuda.Event(), cp.cuda.Event()
            begin.record()
            fn(*args)
            end.record()
            events.append((begin, end))
        events[-1][1].synchronize()
        return [float(cp.cuda.get_elapsed_time(b, e)) for b, e in events]


def make_clock(device: str = "auto", flush_l2: bool = True):
    """The clock for ``device``: ``"gpu"``, ``"cpu"`` or ``"auto"`` (GPU when CuPy sees one)."""
    if device not in ("auto", "gpu", "cpu"):
        raise ValueError(f"device must be 'auto', 'gpu' or 'cpu', not {device!r}")
    if device == "cpu":
        return _CpuClock()
    cp = _device.cupy_or_none()
    if cp is None:
        if device == "gpu":
            raise RuntimeError(f"device='gpu' but no GPU is usable: {_device.gpu_unavailable_reason()}")
        return _CpuClock()
    return _GpuClock(cp, flush_l2)


def time_fn(
    fn: Callable,
    arg_sets: Sequence[Any] | None = None,
    *,
    device: str = "auto",
    clock: Any = None,
    target_rse: float = 0.005,
    min_reps: int = 10,
    max_reps: int = 2000,
    budget_s: float = 2.0,
    warmup: int = 3,
    warmup_s: float = 0.02,
    flush_l2: bool = True,
) -> Timing:
    """Time ``fn(*args)`` over rotating ``arg_sets`` until the mean's relative error < ``target_rse``.

    ``arg_sets`` is a list of argument tuples (or single arguments); call ``i`` uses
    ``arg_sets[i % len(arg_sets)]`` so several input copies keep caches honest.
    At least ``warmup`` untimed calls (and ``warmup_s`` seconds of them) run first.
    The loop stops when ``min_reps`` calls ran and the rse is under ``target_rse``,
    or after ``max_reps`` calls, or once ``budget_s`` seconds of measuring passed.
    ``device`` picks device events (``"gpu"``) or ``perf_counter_ns`` (``"cpu"``);
    ``"auto"`` uses the GPU when CuPy finds one. ``clock`` overrides the choice.
    """
    if not (target_rse > 0 and min_reps >= 2 and max_reps >= min_reps and budget_s > 0):
        raise ValueError("need target_rse > 0, min_reps >= 2, max_reps >= min_reps, budget_s > 0")
    sets = _normalise_arg_sets(arg_sets)
    clk = clock if clock is not None else make_clock(device, flush_l2)

    # Warm-up: compile, load modules, fault pages in; also estimates one call's cost.
    warm_times: list[float] = []
    t_warm = time.perf_counter()
    calls = 0
    while calls < warmup or (time.perf_counter() - t_warm) < warmup_s:
        warm_times.extend(clk.batch(fn, sets, calls, 1))
        calls += 1
        if calls >= max(warmup, 1) * 50:
            break
    clk.sync()
    per_call_ms = max(sorted(warm_times)[len(warm_times) // 2], 1e-4)

    samples: list[float] = []
    t0 = time.perf_counter()
    reason = STOP_MAX_REPS
    while True:
        # Batches of ~50 ms (at least min_reps first), so the stop test runs often
        # enough to respect the budget without syncing after every call.
        remaining = max_reps - len(samples)
        want = max(min_reps - len(samples), int(50.0 / per_call_ms), 1)
        batch = min(remaining, want, 1000)
        samples.extend(clk.batch(fn, sets, calls + len(samples), batch))
        stats = summarize(samples)
        if len(samples) >= min_reps and stats.rse <= target_rse:
            reason = STOP_TARGET
            break
        if len(samples) >= max_reps:
            reason = STOP_MAX_REPS
            break
        if time.perf_counter() - t0 >= budget_s:
            reason = STOP_BUDGET
            break
    elapsed = time.perf_counter() - t0
    return Timing(
        stats=summarize(samples),
        device=clk.name,
        stop_reason=reason,
        target_rse=target_rse,
        warmup_calls=calls,
        rotations=len(sets),
        l2_flush_bytes=int(clk.flush_bytes),
        elapsed_s=elapsed,
    )

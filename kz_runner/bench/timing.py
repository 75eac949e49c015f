"""Timing: device events on a GPU, ``perf_counter_ns`` on the CPU, same statistics.

One timed call is: flush the L2 cache (GPU only; a buffer of twice the device's
L2 is overwritten), record a start event, call the function on the next set of
rotating inputs, record an end event. Calls run in batches; after each batch the
statistics are recomputed and the loop stops as soon as the relative standard
error of the mean is under the target (and at least ``min_reps`` ran), or the
time budget or ``max_reps`` is reached. The headline figure is the median, with a
95 % confidence interval of it (:func:`median_interval`) that the leaderboard reads as
the figure's noise.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kz_runner.bench import device as _device, pristine
from kz_runner.bench.integrity import UNSYNCED_WORK, Finding

# Why the loop stopped (Timing.stop_reason).
STOP_TARGET = "target_rse"
STOP_BUDGET = "budget"
STOP_MAX_REPS = "max_reps"

# The event/wall cross-check (see _GpuClock.unsynced): no-op calls timed to calibrate the loop's
# own cost, the share of the device time the events must see, and the per-call slack allowed.
# On an H200 honest examples' events saw 58-94 % of the device time (launch-bound tiny attention cases
# lowest); work moved to another stream showed 1.6 %. 25 % leaves twice the margin below the lowest.
CALIBRATION_CALLS = 16
UNSYNCED_RATIO = 0.25
UNSYNCED_FLOOR_US = 10.0
# ... or this share of the calibrated overhead, when larger: on an H200 the calibration missed the
# real loop's overhead by ~2 % (13 us of 700 us per call for the fp16 Axpy's 100 MB case).
UNSYNCED_FLOOR_SHARE = 0.05


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
    median_lo: float = 0.0  # 95 % confidence interval of the median (median_interval)
    median_hi: float = 0.0


#: Below this many samples the confidence interval of the median is the whole range (min, max).
MIN_CI_SAMPLES = 6
#: z for a two-sided 95 % interval.
CI_Z = 1.959964


def median_interval(sorted_values: Sequence[float]) -> tuple[float, float]:
    """A 95 % confidence interval of the median of already sorted values, by order statistics.

    The number of samples below the true median is Binomial(n, 1/2), so the order
    statistics ``x[j]`` and ``x[k]`` with ``j, k = n/2 -/+ z*sqrt(n)/2`` (normal
    approximation, rounded outwards) bracket it with about 95 % probability, whatever
    the distribution of the times: no resampling, no randomness, the same interval for
    the same samples. With fewer than ``MIN_CI_SAMPLES`` samples the interval is
    (min, max).
    """
    n = len(sorted_values)
    if n == 0:
        raise ValueError("median_interval needs at least one value")
    if n < MIN_CI_SAMPLES:
        return float(sorted_values[0]), float(sorted_values[-1])
    half = CI_Z * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half) - 1)  # 0-based index of the lower order statistic
    hi = min(n - 1, math.ceil(n / 2 + half))
    return float(sorted_values[lo]), float(sorted_values[hi])


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
    lo, hi = median_interval(values)
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
        median_lo=lo,
        median_hi=hi,
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
    checked_calls: int = 0  # timed calls whose output was compared with its expectation
    event_share: float | None = None  # GPU: summed event time / synchronised device time (about 1 when honest)
    # timed by the judge (kz_runner.judge): its batches and overhead; the samples are then the clean
    # batches' mean call times (only a batch's sum is checked against the judge's clock), n is the batches
    judge: dict[str, Any] | None = None
    # a confirmation run's: the operator's reference kernel timed alternately with this one in the same
    # run, {kernel, time_ratio (this median / the reference's), lo, hi (over the rounds), rounds}
    reference: dict[str, Any] | None = None

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
            f"rse {s.rse * 100:.3f}%  95% CI {s.median_lo * 1e3:.3f}-{s.median_hi * 1e3:.3f} us  p10/p90 {s.p10 * 1e3:.3f}/{s.p90 * 1e3:.3f} us  "
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
    """perf_counter_ns (the reference taken at import) around each call; nothing to flush."""

    name = "cpu"
    flush_bytes = 0

    def sync(self) -> None:
        """Nothing to wait for on the CPU."""

    def calibrate(self, arg_sets: list[tuple], start: int, probe: Any = None) -> None:
        """Nothing to calibrate: the CPU clock has no second clock to cross-check."""

    def unsynced(self) -> Any:
        """No event/wall cross-check on the CPU (threads are counted instead)."""
        return None

    def batch(self, fn: Callable, arg_sets: list[tuple], start: int, count: int,
              probe: Any = None, account: bool = True) -> list[float]:
        """Time ``count`` calls starting at input set ``start``; milliseconds per call."""
        clock = pristine.perf_counter_ns
        out = []
        k = len(arg_sets)
        for i in range(count):
            args = arg_sets[(start + i) % k]
            if probe is not None:
                args = probe.before(start + i, args)
            t0 = clock()
            returned = fn(*args)
            t1 = clock()
            out.append((t1 - t0) / 1e6)
            if probe is not None:
                probe.after(start + i, returned, args, probe.selected(start + i))
        return out


class _GpuClock:
    """CuPy events around each call on the current stream, with an L2 flush before it.

    Every batch ends with a device-wide synchronise, so work left on other streams is
    waited for before the batch's wall time is read. The per-call event times are
    cross-checked against that wall time (see :meth:`unsynced`).
    """

    name = "gpu"

    def __init__(self, cp: Any, flush_l2: bool) -> None:
        self.cp = cp
        self.flush_bytes = 2 * _device.l2_cache_bytes(cp) if flush_l2 else 0
        self._flush = cp.empty(self.flush_bytes, dtype=cp.uint8) if self.flush_bytes else None
        self.event_ms = 0.0  # sum of the timed calls' event times
        self.wall_s = 0.0  # synchronised wall time of the timed batches
        self.calls = 0
        self.segments = 0  # stretches of calls that ended with a device synchronise
        self.overhead_call_s = 0.0  # calibrated wall time of one call's surroundings (flush, refill, events)
        self.overhead_segment_s = 0.0  # calibrated wall time of one synchronise

    def sync(self) -> None:
        """Wait for every stream of the device."""
        pristine.device_synchronize()

    def calibrate(self, arg_sets: list[tuple], start: int, probe: Any = None) -> None:
        """Measure the wall time of the loop around a call that does nothing (median of 3)."""
        calibration = probe.calibration() if probe is not None else None
        per_call, per_sync = [], []
        clock = pristine.perf_counter
        for _ in range(3):
            t0 = clock()
            self.sync()
            t1 = clock()
            self.batch(_nothing, arg_sets, start, CALIBRATION_CALLS, probe=calibration, account=False)
            t2 = clock()
            per_sync.append(t1 - t0)
            per_call.append(max(0.0, (t2 - t1) - (t1 - t0)) / CALIBRATION_CALLS)
        self.overhead_call_s = sorted(per_call)[1]
        self.overhead_segment_s = sorted(per_sync)[1]

    def unsynced(self) -> Any:
        """An UNSYNCED_WORK finding when the events saw far less time than the device spent.

        The device time of the timed calls is the synchronised wall time less the
        calibrated overhead. Honest calls' events cover their work, so the two agree;
        work queued on another stream (or finished by a later synchronise) shows up in
        the wall time only. The finding needs both the events under UNSYNCED_RATIO of it
        and more than UNSYNCED_FLOOR_US (or UNSYNCED_FLOOR_SHARE of the calibrated
        overhead) per call unaccounted for, so a tiny kernel whose overhead estimate is
        a few microseconds off never trips it. Work escaping for less than that floor
        still races the next call's poison fill and is caught as a wrong output.
        """
        if self.calls < 10:
            return None
        device_ms = (self.wall_s - self.calls * self.overhead_call_s - self.segments * self.overhead_segment_s) * 1e3
        missing_us = (device_ms - self.event_ms) * 1e3 / self.calls
        floor_us = max(UNSYNCED_FLOOR_US, UNSYNCED_FLOOR_SHARE * self.overhead_call_s * 1e6)
        if self.event_ms >= UNSYNCED_RATIO * device_ms or missing_us <= floor_us:
            return None
        return Finding(
            UNSYNCED_WORK,
            f"the timed calls' events measured {self.event_ms / self.calls * 1e3:.1f} us per call but the "
            f"device was busy {device_ms / self.calls * 1e3:.1f} us per call until synchronised: "
            "work ran outside the timed stream",
            evidence={"calls": self.calls, "event_ms": round(self.event_ms, 4), "device_ms": round(device_ms, 4),
                      "overhead_call_us": round(self.overhead_call_s * 1e6, 3)},
        )

    def event_share(self) -> float | None:
        """Summed event time over the device time of the timed calls (see :meth:`unsynced`)."""
        device_ms = (self.wall_s - self.calls * self.overhead_call_s - self.segments * self.overhead_segment_s) * 1e3
        return round(self.event_ms / device_ms, 4) if self.calls and device_ms > 0 else None

    def batch(self, fn: Callable, arg_sets: list[tuple], start: int, count: int,
              probe: Any = None, account: bool = True) -> list[float]:
        """Flush, then time ``count`` calls with event pairs; a device sync at the end; ms per call."""
        event, record, sync, clock = pristine.event_class, pristine.event_record, self.sync, pristine.perf_counter
        events = []
        k = len(arg_sets)
        wall, segments = 0.0, 0
        sync()
        t0 = clock()
        for i in range(count):
            args = arg_sets[(start + i) % k]
            if probe is not None:
                args = probe.before(start + i, args)
            if self._flush is not None:
                self._flush.fill(i & 0xFF)
            begin, end = event(), event()
            record(begin)
            returned = fn(*args)
            record(end)
            events.append((begin, end))
            if probe is not None:
                compare = probe.selected(start + i)
                if compare:  # the output is read after every stream finished, outside the wall time
                    sync()
                    wall += clock() - t0
                    segments += 1
                probe.after(start + i, returned, args, compare)
                if compare:
                    t0 = clock()
        sync()
        wall += clock() - t0
        segments += 1
        elapsed = pristine.get_elapsed_time
        times = [float(elapsed(b, e)) for b, e in events]
        if account:
            self.event_ms += math.fsum(times)
            self.wall_s += wall
            self.calls += count
            self.segments += segments
        return times


def _nothing(*args: Any) -> None:
    return None


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
    guard: Any = None,
    probe: Any = None,
) -> Timing:
    """Time ``fn(*args)`` over rotating ``arg_sets`` until the mean's relative error < ``target_rse``.

    ``arg_sets`` is a list of argument tuples (or single arguments); call ``i`` uses
    ``arg_sets[i % len(arg_sets)]`` so several input copies keep caches honest.
    At least ``warmup`` untimed calls (and ``warmup_s`` seconds of them) run first.
    The loop stops when ``min_reps`` calls ran and the rse is under ``target_rse``,
    or after ``max_reps`` calls, or once ``budget_s`` seconds of measuring passed.
    ``device`` picks device events (``"gpu"``) or ``perf_counter_ns`` (``"cpu"``);
    ``"auto"`` uses the GPU when CuPy finds one. ``clock`` overrides the choice.

    With a ``guard`` (:class:`kz_runner.bench.integrity.Guard`) the timed region is
    checked after every batch: replaced clock functions, threads left running and
    (GPU) event time far below synchronised wall time raise
    :class:`~kz_runner.bench.integrity.IntegrityFailure`. A ``probe``
    (:class:`kz_runner.bench.trials.Trials`) supplies the argument sets and checks outputs.
    """
    if not (target_rse > 0 and min_reps >= 2 and max_reps >= min_reps and budget_s > 0):
        raise ValueError("need target_rse > 0, min_reps >= 2, max_reps >= min_reps, budget_s > 0")
    sets = probe.sets if probe is not None else _normalise_arg_sets(arg_sets)
    clk = clock if clock is not None else make_clock(device, flush_l2)
    ours = isinstance(clk, (_CpuClock, _GpuClock))

    def run(start: int, count: int, account: bool) -> list[float]:
        if not ours:  # a caller's clock (tests) takes the plain arguments only
            return clk.batch(fn, sets, start, count)
        return clk.batch(fn, sets, start, count, probe=probe, account=account)

    # Warm-up: compile, load modules, fault pages in; also estimates one call's cost.
    now = pristine.perf_counter
    warm_times: list[float] = []
    t_warm = now()
    calls = 0
    while calls < warmup or (now() - t_warm) < warmup_s:
        warm_times.extend(run(calls, 1, False))
        calls += 1
        if calls >= max(warmup, 1) * 50:
            break
    clk.sync()
    warm = calls
    per_call_ms = max(sorted(warm_times)[len(warm_times) // 2], 1e-4)
    if ours:
        clk.calibrate(sets, calls, probe)
        calls += 3 * CALIBRATION_CALLS if isinstance(clk, _GpuClock) else 0
    if guard is not None:
        guard.check_timer()
        guard.start()
    if probe is not None:
        probe.start_timing(calls)

    samples: list[float] = []
    t0 = now()
    reason = STOP_MAX_REPS
    while True:
        # Batches of ~50 ms (at least min_reps first), so the stop test runs often
        # enough to respect the budget without syncing after every call.
        remaining = max_reps - len(samples)
        want = max(min_reps - len(samples), int(50.0 / per_call_ms), 1)
        batch = min(remaining, want, 1000)
        samples.extend(run(calls + len(samples), batch, True))
        if probe is not None:
            probe.verify()
        if guard is not None:
            guard.check(clk if ours else None)
            if probe is not None and probe.pending is not None:
                guard.fail(probe.pending)
        stats = summarize(samples)
        if len(samples) >= min_reps and stats.rse <= target_rse:
            reason = STOP_TARGET
            break
        if len(samples) >= max_reps:
            reason = STOP_MAX_REPS
            break
        if now() - t0 - (probe.spent_s if probe is not None else 0.0) >= budget_s:  # checking is not measuring
            reason = STOP_BUDGET
            break
    elapsed = now() - t0
    return Timing(
        stats=summarize(samples),
        device=clk.name,
        stop_reason=reason,
        target_rse=target_rse,
        warmup_calls=warm,
        rotations=len(sets),
        l2_flush_bytes=int(clk.flush_bytes),
        elapsed_s=elapsed,
        checked_calls=probe.checked_calls if probe is not None else 0,
        event_share=clk.event_share() if isinstance(clk, _GpuClock) else None,
    )

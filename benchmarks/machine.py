"""Facts about the machine a benchmark ran on, recorded beside every figure, and the
timing and counting helpers the scripts share.

Imported by the scripts in this folder (run as ``python benchmarks/<script>.py``, so this
folder is on ``sys.path``).
"""
from __future__ import annotations

import math
import os
import platform
import time


def cpu_model() -> str | None:
    """The CPU model name from /proc/cpuinfo (None where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def machine_facts(**extra: object) -> dict:
    """CPU count and model, Python, platform and the 1-minute load average now, plus ``extra``."""
    facts = {"cpus": os.cpu_count(), "cpu_model": cpu_model(), "python": platform.python_version(),
             "platform": platform.platform(), "loadavg_1m_at_end": round(os.getloadavg()[0], 2)}
    facts.update(extra)
    return facts


def calibration_s() -> float:
    """Seconds for a fixed pure-Python loop (best of 3): how fast this machine is right now.

    The development machine is a VM whose speed moves with its host's load (the same
    code has measured 2x apart within an hour while the VM itself was idle); results
    files carry this figure at the start and end of a run so runs can be compared.
    """
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        total = 0
        for i in range(2_000_000):
            total += i
        best = min(best, time.perf_counter() - start)
    return round(best, 4)


def timed_threads(count: int, work) -> float:
    """Seconds for ``count`` threads running ``work(i)``, all released together by a barrier."""
    import threading

    barrier = threading.Barrier(count + 1)

    def run(i: int) -> None:
        barrier.wait()
        work(i)

    pool = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in pool:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in pool:
        t.join()
    return time.perf_counter() - started


def timed_coroutines(count: int, work) -> float:
    """Seconds for ``count`` coroutines ``work(i)`` gathered on one new event loop."""
    import asyncio

    async def run_all() -> float:
        started = time.perf_counter()
        await asyncio.gather(*[work(i) for i in range(count)])
        return time.perf_counter() - started

    return asyncio.run(run_all())


class AppendCounter:
    """``with AppendCounter(store) as fsyncs:``: counts the store's log appends (one fsync
    each) in ``fsyncs.count`` while the block runs."""

    def __init__(self, store) -> None:
        self.store, self.count = store, 0
        self._real = store._log.append

    def _append(self, records):
        self.count += 1
        return self._real(records)

    def __enter__(self) -> AppendCounter:
        self.store._log.append = self._append
        return self

    def __exit__(self, *exc: object) -> None:
        self.store._log.append = self._real


def percentile(values: list[float], q: float) -> float:
    """The q-quantile by nearest rank: the smallest value with at least q of the values at or below it."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

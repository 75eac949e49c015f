"""``kz_runner.bench``: the timing and checking library package authors import in benchmark.py.

- :func:`time_fn` — CuPy device events around each call (L2 flushed before each
  call with a buffer of twice the device's L2), warm-up, adaptive repetitions
  until the mean's relative standard error is under a target or a budget runs
  out, rotating input sets; ``time.perf_counter_ns`` on the CPU, same statistics.
- :func:`check` — max abs/rel error and mismatch count (``atol + rtol*|exp|``).
- :class:`Scorecard` / :func:`regression_check` — best/current from
  ``bench_result.yaml`` (seed sentinel ignored) and a regression tolerance in
  the metric's direction.
- :func:`emit` — a schema-valid benchmark_output document, one JSON on stdout.
- :class:`Harness` — the whole loop, so a benchmark.py is a few dozen lines.

Importable without CuPy; CuPy is loaded only when a GPU clock is asked for.
"""
from __future__ import annotations

from kz_runner.bench.check import Check, check
from kz_runner.bench.device import copies, cupy_or_none, detect_arch, gpu_unavailable_reason, l2_cache_bytes, rotation_count, to_numpy
from kz_runner.bench.harness import CaseRun, Harness, StdoutGuard
from kz_runner.bench.manifest import write_build_manifest
from kz_runner.bench.output import build_document, case_result, dumps, emit, nonfinite_paths, utc_now, write_document
from kz_runner.bench.scorecard import SEED_SENTINEL, Regression, Scorecard, is_sentinel, regression_check
from kz_runner.bench.timing import Stats, Timing, make_clock, summarize, time_fn

__all__ = [
    "CaseRun", "Check", "Harness", "Regression", "SEED_SENTINEL", "Scorecard", "Stats", "StdoutGuard", "Timing",
    "build_document", "case_result", "check", "copies", "cupy_or_none", "detect_arch", "dumps", "emit",
    "gpu_unavailable_reason", "is_sentinel", "l2_cache_bytes", "make_clock", "nonfinite_paths",
    "regression_check", "rotation_count", "summarize", "time_fn", "to_numpy", "utc_now",
    "write_build_manifest", "write_document",
]

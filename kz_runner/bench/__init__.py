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
- :func:`kernel` — names the kernel (``src/<module>.py``, a function) without importing it;
  ``CaseRun.time`` then times it through the judge (:mod:`kz_runner.judge`), whose process
  never runs the package's code.

- :meth:`CaseRun.time` with ``expected=``/``reference=``/``out=`` — the checked
  timing: seeded trial inputs, poisoned output buffers, exact output types, the
  timed calls' outputs compared (:mod:`kz_runner.bench.trials`).
- Integrity defences (:mod:`kz_runner.bench.pristine`, :mod:`kz_runner.bench.integrity`):
  private clock references, thread census, event/wall cross-check; a finding is
  reported with a stable code on the runner's result channel (:mod:`kz_runner.bench.channel`).

Importable without CuPy. When CuPy is installed it is imported here, at import, so its
event and sync functions are captured before any package code runs; import this
package before the package's source area.
"""
from __future__ import annotations

# First, before anything a package could have touched: the runner's pipes and the clock references.
from kz_runner.bench import channel, pristine  # noqa: I001
import sys as _sys
from kz_runner.bench.check import Check, check
from kz_runner.bench.device import copies, cupy_or_none, detect_arch, gpu_unavailable_reason, l2_cache_bytes, rotation_count, to_numpy
from kz_runner.bench.harness import CaseFailure, CaseRun, Harness, KernelRef, StdoutGuard, Unjudged, kernel
from kz_runner.bench.integrity import CODES, Finding, IntegrityFailure
from kz_runner.bench.manifest import write_build_manifest
from kz_runner.bench.output import build_document, case_result, dumps, emit, nonfinite_paths, utc_now, write_document
from kz_runner.bench.scorecard import SEED_SENTINEL, Regression, Scorecard, is_sentinel, regression_check
from kz_runner.bench.timing import Stats, Timing, make_clock, summarize, time_fn
from kz_runner.bench import check as _m_check, device as _m_device, harness as _m_harness  # noqa: E402
from kz_runner.bench import integrity as _m_integrity, output as _m_output, timing as _m_timing  # noqa: E402
from kz_runner.bench import scorecard as _m_scorecard, trials as _m_trials  # noqa: E402

__all__ = [
    "CODES", "CaseFailure", "CaseRun", "Check", "Finding", "Harness", "IntegrityFailure", "KernelRef", "Regression",
    "SEED_SENTINEL", "Scorecard", "Stats", "StdoutGuard", "Timing", "Unjudged", "kernel",
    "build_document", "case_result", "check", "copies", "cupy_or_none", "detect_arch", "dumps", "emit",
    "gpu_unavailable_reason", "is_sentinel", "l2_cache_bytes", "make_clock", "nonfinite_paths",
    "regression_check", "rotation_count", "summarize", "time_fn", "to_numpy", "utc_now",
    "write_build_manifest", "write_document",
]


def _report_unjudged(kind, value, tb, _previous=_sys.excepthook) -> None:
    """In the judge's step, a benchmark that dies importing its source area (absent there), or that
    times what the judge cannot serve, says so on the result channel: the runner then runs it with the
    source visible, unverified. Anything else dies as usual."""
    if issubclass(kind, (ImportError, Unjudged)):
        channel.send(channel.unjudged_document(f"{kind.__name__}: {value}"))
        print(f"{UNJUDGED_MARK} {kind.__name__}: {value}", file=_sys.stderr, flush=True)  # kz dry-run reads it
    _previous(kind, value, tb)


#: the stderr line that says the judge's step cannot time this benchmark (see _report_unjudged)
UNJUDGED_MARK = "[kz-bench] unjudged:"

if channel.judged():
    _sys.excepthook = _report_unjudged

# Seal the library's own functions and the array libraries' as they are now, before package code runs.
pristine.seal(_m_check, _m_device, _m_harness, _m_integrity, _m_output, _m_scorecard, _m_timing, _m_trials,
              channel, pristine, _sys.modules[__name__])
pristine.seal_array_libraries()

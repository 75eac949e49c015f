"""``Harness``: the loop every benchmark.py runs, so a package's benchmark stays short.

Typical use (see examples/*/.kernel_package/benchmark.py)::

    def main(argv):
        h = bench.Harness.from_argv(argv, __file__, KERNEL_ZOO_TEST_CASE_METAS,
                                    regression_tolerance=0.05, device="gpu")
        for meta in h.metas:
            with h.case(meta) as c:
                x = h.xp.asarray(c.input("x"))
                c.check(my_op(x), c.expected("out"))
                t = c.time(my_op, bench.copies([x], 4))
                c.metric("latency_us", t.median_us)
        return h.finish()

Each ``with h.case(meta)`` block records one case; an exception inside it becomes
that case's ``error`` (accept false) instead of crashing the run, so stdout still
carries one valid document. ``finish`` judges every case (correctness passed and
the primary metric within the regression tolerance of the scorecard's best),
writes the document to the real stdout and returns the exit code.
"""
from __future__ import annotations

import io
import json
import math
import os
import random
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from kz_runner.bench import channel, device as _device, pristine
from kz_runner.bench.check import Check, check as _check
from kz_runner.bench.integrity import HARNESS_ERROR, TIMER_TAMPERED, Finding, Guard, IntegrityFailure
from kz_runner.bench.output import build_document, case_result, write_document
from kz_runner.bench.scorecard import Scorecard, regression_check
from kz_runner.bench.timing import Timing, time_fn
from kz_runner.bench.trials import Trials
from kz_runner.contract.layout import BENCH_RESULT, KP

USAGE = "usage: benchmark.py <workdir>"
CPU_TRIALS = 4  # argument buffers rotated on the CPU, as many as the input copies it always rotated


class StdoutGuard:
    """Send everything written to fd 1 to stderr; keep the real stdout for the result.

    Native code or a stray ``print`` in the implementation then cannot corrupt the
    one JSON document the runner parses. ``stream`` writes to the saved stdout.
    """

    def __init__(self) -> None:
        self.stream: IO[str] | None = None
        self._saved_fd: int | None = None
        self._saved_sys_stdout = None

    def __enter__(self) -> StdoutGuard:
        sys.stdout.flush()
        self._saved_fd = os.dup(1)
        os.dup2(2, 1)
        self._saved_sys_stdout = sys.stdout
        sys.stdout = sys.stderr
        self.stream = io.TextIOWrapper(os.fdopen(os.dup(self._saved_fd), "wb"), encoding="utf-8")
        return self

    def seal(self) -> None:
        """After the document: close the real stdout for good, so nothing can follow the document."""
        if self.stream is not None:
            self.stream.flush()
            self.stream.close()
            self.stream = None
        sys.stdout.flush()
        if self._saved_fd is not None:
            os.close(self._saved_fd)
            self._saved_fd = None
        self._saved_sys_stdout = None  # sys.stdout and fd 1 stay on stderr

    def __exit__(self, *exc: Any) -> None:
        if self.stream is not None:
            self.stream.flush()
            self.stream.close()
        sys.stdout.flush()
        if self._saved_fd is not None:
            os.dup2(self._saved_fd, 1)
            os.close(self._saved_fd)
        if self._saved_sys_stdout is not None:
            sys.stdout = self._saved_sys_stdout


def metric_spread(value: float, timing: Timing, direction: str) -> dict[str, Any] | None:
    """``{n, lo, hi}`` of a metric computed from ``timing``'s median, or None when it cannot be scaled.

    A primary metric is a time (``lower_better``: proportional to the median) or a rate
    (``higher_better``: inversely proportional), as the physics floor requires, so the
    median's confidence interval maps onto the metric's own unit by the same ratio.
    """
    s = timing.stats
    if not (s.median > 0 and s.median_lo > 0 and s.median_hi >= s.median_lo and math.isfinite(value)):
        return None
    if direction == "higher_better":
        lo, hi = value * s.median / s.median_hi, value * s.median / s.median_lo
    else:
        lo, hi = value * s.median_lo / s.median, value * s.median_hi / s.median
    lo, hi = min(lo, value), max(hi, value)  # the interval always holds the figure itself
    return {"n": int(s.n), "lo": float(lo), "hi": float(hi)}


class CaseRun:
    """One case being measured: inputs, the correctness check, timings and metrics."""

    def __init__(self, harness: Harness, meta: dict[str, Any]) -> None:
        self.harness = harness
        self.meta = meta
        self.id: str = meta["test_case_id"]
        self.params: dict[str, Any] = dict(meta.get("params") or {})
        self.checked: Check | None = None
        self.timings: list[Timing] = []
        self.metrics: dict[str, float] = {}
        self.metric_timings: dict[str, Timing] = {}  # the timing each metric was recorded after
        self.error: str | None = None

    def input(self, name: str) -> Any:
        """``WORKDIR/inputs/<case>_<name>.npy`` as a NumPy array."""
        return self.harness.load("inputs", f"{self.id}_{name}.npy")

    def expected(self, name: str) -> Any:
        """``WORKDIR/expected/<case>_<name>.npy`` as a NumPy array."""
        return self.harness.load("expected", f"{self.id}_{name}.npy")

    def check(self, out: Any, expected: Any) -> Check:
        """Compare with the meta's ``tolerance`` (atol + rtol*|exp| element-wise); recorded."""
        tol = self.meta["tolerance"]
        result = _check(out, expected, tol["correctness_atol"], tol["correctness_rtol"])
        self.checked = result
        self.harness.log(
            f"case {self.id}: correctness {'passed' if result.passed else 'FAILED'} "
            f"max_abs_err={result.max_abs_err:.3g} max_rel_err={result.max_rel_err:.3g} "
            f"mismatches={result.mismatch_count}/{result.checked}"
            + (f" ({result.error})" if result.error else "")
        )
        return result

    def time(self, fn: Callable, inputs: Sequence[Any] | None = None, *, reference: Callable | None = None,
             expected: Any = None, out: Any = None, vary: Callable | None = None, trials: int | None = None,
             **overrides: Any) -> Timing:
        """Check ``fn`` and time it with the harness's settings (``overrides`` win); logged to stderr.

        Checked form (give ``expected`` and/or ``reference``; without ``reference`` the
        timed calls get no fresh inputs and the timing ends in WEAK_TRIALS): ``inputs`` is
        one tuple of arguments; ``fn(*inputs)`` (or ``fn(*inputs, out)`` with an output buffer ``out``)
        is first called untimed and checked against ``expected`` (recorded as the case's
        correctness check), then timed with a fresh seeded variation of the inputs on every
        call (in ``trials`` rotating argument buffers), poisoned output buffers, and a seeded
        sample of the timed calls' outputs compared with what ``reference`` computes for
        their inputs (see :mod:`kz_runner.bench.trials`). ``vary(rng, inputs) -> inputs``
        replaces the default variation (moves, and a factor in [0.875, 1) on each float); it runs
        before every call, so keep it cheap.
        Plain form (neither given): ``inputs`` is a list of argument sets, timed as by
        :func:`time_fn`. Both forms check the timer, threads and (GPU) unsynchronised work.
        """
        harness = self.harness
        if harness.finding is not None:
            raise IntegrityFailure(harness.finding)
        settings = dict(harness.timing_settings)
        settings.update(overrides)
        guard = Guard(harness._report_finding, self.id)
        if expected is None and reference is None:
            if out is not None or vary is not None or trials is not None:
                raise ValueError("out=, vary= and trials= need expected= or reference=")
            timing = time_fn(fn, inputs, guard=guard, **settings)
        else:
            timing = self._time_checked(fn, inputs, reference, expected, out, vary, trials, guard, settings)
        self.timings.append(timing)
        harness.log(f"case {self.id}: {timing.describe()}")
        harness.log("timing " + json.dumps({"test_case_id": self.id, **timing.to_json()}))
        return timing

    def _time_checked(self, fn: Callable, inputs: Sequence[Any] | None, reference: Callable | None, expected: Any,
                      out: Any, vary: Callable | None, trials: int | None, guard: Guard,
                      settings: dict[str, Any]) -> Timing:
        harness = self.harness
        args = tuple(inputs) if isinstance(inputs, (tuple, list)) else (() if inputs is None else (inputs,))
        xp = harness.xp
        if trials is None:
            nbytes = sum(int(getattr(a, "nbytes", 0)) for a in args) + int(getattr(out, "nbytes", 0))
            trials = _device.rotation_count(nbytes) if xp.__name__ == "cupy" else CPU_TRIALS
        tol = self.meta["tolerance"]
        rng = random.Random(f"{harness.trial_seed}:{self.id}:{len(self.timings)}")
        run = Trials(xp, args, expected=expected, reference=reference, out=out, count=trials, rng=rng,
                     atol=tol["correctness_atol"], rtol=tol["correctness_rtol"], vary=vary)
        run.guard = guard
        first = run.first_call(fn)
        run.check_type(first)
        passed = self.check(first, run.expected0).passed
        del first
        if not passed:  # the case already failed; time it without comparing outputs
            return time_fn(fn, run.sets, guard=guard, **settings)
        return time_fn(fn, probe=run, guard=guard, **settings)

    def metric(self, name: str, value: float) -> None:
        """Record a metric value (declared in the meta's ``metrics``).

        The primary metric recorded after a :meth:`time` carries that timing's spread
        in the document (:func:`metric_spread`): the number of timed calls and the
        95 % confidence interval of the median, scaled to the metric.
        """
        self.metrics[name] = float(value)
        if self.timings:
            self.metric_timings[name] = self.timings[-1]
        else:
            self.metric_timings.pop(name, None)

    def __enter__(self) -> CaseRun:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None and issubclass(exc_type, IntegrityFailure):
            self.error = exc.finding.line()
        elif exc_type is not None and issubclass(exc_type, Exception):
            self.error = f"{exc_type.__name__}: {exc}"
            self.harness.log(f"case {self.id}: error\n" + "".join(traceback.format_exception(exc_type, exc, tb)))
        self.harness._record(self)
        return exc_type is not None and issubclass(exc_type, Exception)


class Harness:
    """Runs a package's cases and emits the verdict; see the module docstring."""

    def __init__(
        self,
        workdir: str | Path,
        package_file: str | Path,
        metas: Sequence[dict[str, Any]],
        *,
        regression_tolerance: float | dict[str, float],
        against: str = "best",
        device: str = "auto",
        kernel_id: str | None = None,
        scorecard: Scorecard | None = None,
        log_stream: IO[str] | None = None,
        out_stream: IO[str] | None = None,
        **timing: Any,
    ) -> None:
        if against not in ("best", "current"):
            raise ValueError("against must be 'best' or 'current'")
        self.workdir = Path(workdir)
        self.package_root = Path(package_file).resolve().parent.parent
        self.metas = list(metas)
        self.regression_tolerance = regression_tolerance
        self.against = against
        self.device = device
        card_path = self.package_root / KP / BENCH_RESULT
        self.scorecard = scorecard if scorecard is not None else Scorecard.load(card_path)
        self.kernel_id = kernel_id or self.scorecard.kernel_id
        if not self.kernel_id:
            raise ValueError(f"no kernel_id: pass kernel_id= or provide {card_path}")
        self._log = log_stream
        self._out = out_stream
        self.timing_settings: dict[str, Any] = {"device": "cpu" if device == "cpu" else device}
        self.timing_settings.update(timing)
        self.results: list[dict[str, Any]] = []
        self._guard: StdoutGuard | None = None
        self.trial_seed = channel.trial_seed()
        self.finding: Finding | None = None  # the first integrity finding; it voids the run

    @classmethod
    def from_argv(cls, argv: Sequence[str], package_file: str | Path, metas: Sequence[dict[str, Any]],
                  *, guard_stdout: bool = True, **kwargs: Any) -> Harness:
        """``python benchmark.py <workdir>``: exits 2 with usage on bad arguments.

        With ``guard_stdout`` (default) fd 1 is redirected to stderr until ``finish``.
        """
        if len(argv) != 2 or not Path(argv[1]).is_dir():
            print(USAGE + (f" ({argv[1]} is not a directory)" if len(argv) == 2 else ""), file=sys.stderr)
            raise SystemExit(2)
        harness = cls(argv[1], package_file, metas, **kwargs)
        if guard_stdout:
            harness._guard = StdoutGuard().__enter__()
            harness._out = harness._guard.stream
        return harness

    # -- helpers for the case bodies -------------------------------------------------

    @property
    def xp(self) -> Any:
        """The array module: CuPy on a GPU, NumPy for ``device="cpu"``; raises without a GPU when one is needed."""
        if self.device == "cpu":
            import numpy

            return numpy
        cp = _device.cupy_or_none()
        if cp is None:
            if self.device == "gpu":
                raise RuntimeError(f"this benchmark needs a GPU: {_device.gpu_unavailable_reason()}")
            import numpy

            return numpy
        return cp

    def load(self, folder: str, name: str) -> Any:
        """``WORKDIR/<folder>/<name>`` loaded with numpy.load (no pickles)."""
        import numpy as np

        return np.load(self.workdir / folder / name, allow_pickle=False)

    def log(self, message: str) -> None:
        """One line on stderr (never stdout)."""
        stream = self._log if self._log is not None else sys.stderr
        print(f"[kz-bench] {message}", file=stream, flush=True)

    def case(self, meta: dict[str, Any]) -> CaseRun:
        """A context manager recording one case (exceptions become the case's error)."""
        return CaseRun(self, meta)

    def run(self, body: Callable[[CaseRun], None]) -> int:
        """Run ``body(case)`` for every meta, then :meth:`finish`."""
        for meta in self.metas:
            if self.finding is not None:
                break  # the run is void; finish lists the remaining cases as not run
            with self.case(meta) as c:
                body(c)
        return self.finish()

    def _report_finding(self, finding: Finding) -> None:
        if self.finding is None:
            self.finding = finding
        self.log(f"integrity: {finding.line()} (case {finding.case})")

    # -- judging ---------------------------------------------------------------------

    def _tolerance_for(self, case_id: str) -> float:
        tol = self.regression_tolerance
        return float(tol.get(case_id, tol.get("*", 0.05))) if isinstance(tol, dict) else float(tol)

    def _describe_tolerance(self) -> str:
        tol = self.regression_tolerance
        if isinstance(tol, dict):
            return ", ".join(f"{k} {v * 100:g}%" for k, v in sorted(tol.items()))
        return f"{tol * 100:g}%"

    def _record(self, run: CaseRun) -> None:
        meta = run.meta
        primary = meta["primary_metric"]
        units = {m["name"]: m.get("unit", "") for m in meta.get("metrics", [])}
        directions = {m["name"]: m["direction"] for m in meta.get("metrics", [])}
        metrics = {}
        errors = [run.error] if run.error else []
        for name, value in run.metrics.items():
            if math.isfinite(value):
                metrics[name] = value
            else:
                errors.append(f"metric {name} is not finite ({value})")
        spreads = {}
        if primary in metrics and primary in run.metric_timings:
            spread = metric_spread(metrics[primary], run.metric_timings[primary],
                                   directions.get(primary, "lower_better"))
            if spread is not None:
                spreads[primary] = spread
        if run.checked is None:
            correctness = "failed"
            if not run.error:
                errors.append("benchmark.py did not run the correctness check")
        else:
            correctness = "passed" if run.checked.passed else "failed"
            if run.checked.error:
                errors.append(run.checked.error)
        accept = correctness == "passed" and not errors
        if errors and (run.checked is None or correctness == "passed"):
            reason = "error: " + errors[0]
        elif correctness != "passed":
            reason = f"correctness failed ({run.checked.mismatch_count} of {run.checked.checked} elements " \
                     f"outside tolerance, max_abs_err {run.checked.max_abs_err:.3g})"
        elif errors:
            reason = "error: " + errors[0]
        elif primary not in metrics:
            accept, reason = False, f"primary metric {primary} was not measured"
        else:
            reference = (self.scorecard.best if self.against == "best" else self.scorecard.current)(run.id, primary)
            verdict = regression_check(
                metrics[primary], reference, directions.get(primary, "lower_better"),
                self._tolerance_for(run.id), metric=primary, unit=units.get(primary, ""), against=self.against,
            )
            accept, reason = verdict.ok, verdict.reason
        self.results.append(
            case_result(
                run.id,
                correctness=correctness,
                accept=accept,
                metrics=[dict({"name": k, "value": v}, **({"spread": spreads[k]} if k in spreads else {}))
                         for k, v in metrics.items()],
                correctness_detail=run.checked.to_detail() if run.checked else None,
                accept_reason=reason,
                error="; ".join(errors) if errors else None,
            )
        )
        self.log(f"case {run.id}: {'accept' if accept else 'REJECT'} ({reason})")

    def finish(self) -> int:
        """Emit the document (one JSON on the real stdout, and on the runner's result channel); returns 0.

        The verdict is in the JSON. With an integrity finding every case is rejected,
        ``overall.accept_reason`` starts with its code, and the result channel carries
        the finding instead of the document.
        """
        try:
            doc = self._document()
            write_document(doc, self._out)
        except Exception as exc:  # a bug here must still reach the runner as a finding, not silence
            channel.send(channel.integrity_document(HARNESS_ERROR, f"the harness failed: {type(exc).__name__}: "
                                                    f"{exc}"[:500], None, {}))
            raise
        finally:
            if self._guard is not None:
                self._guard.seal()
                self._guard = None
        self.document = doc
        f = self.finding
        if f is not None:
            channel.send(channel.integrity_document(f.code, f.line()[len(f.code) + 2:][:1000], f.case, f.evidence))
        else:
            channel.send(channel.result_document(doc))
        return 0

    def _document(self) -> dict[str, Any]:
        recorded = {r["test_case_id"] for r in self.results}
        for meta in self.metas:  # a case the body never entered still appears, as failed
            if meta["test_case_id"] not in recorded:
                run = CaseRun(self, meta)
                run.error = "case was not run"
                self._record(run)
        changed = pristine.tampered()
        if changed and self.finding is None:
            self._report_finding(Finding(TIMER_TAMPERED, f"{', '.join(changed[:3])} replaced while the package ran",
                                         evidence={"replaced": changed[:10]}))
        if channel.protocol_error() and self.finding is None:
            self._report_finding(Finding(HARNESS_ERROR, channel.protocol_error() or ""))
        arch = "cpu" if self.device == "cpu" else _device.detect_arch(self.device)
        if self.finding is not None:
            for r in self.results:  # one finding voids the whole run
                if r["accept"]:
                    r["accept"] = False
                    r["accept_reason"] = f"run void: {self.finding.line()}"[:2000]
            reason = self.finding.line()
        elif rejected := [r for r in self.results if not r["accept"]]:
            reason = f"rejected {len(rejected)} of {len(self.results)} cases: " + "; ".join(
                f"{r['test_case_id']}: {r.get('accept_reason', '')}" for r in rejected)
        else:
            reason = f"all {len(self.results)} cases accepted (regression tolerance " \
                     f"{self._describe_tolerance()} against the {self.against})"
        return build_document(self.kernel_id, self.results, arch=arch, accept_reason=reason[:2000])

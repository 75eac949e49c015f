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

``bench.kernel("softmax", "softmax_rows")`` names a kernel without importing it (a
:class:`KernelRef`); ``c.time(ref, ...)`` then times it through the judge
(:mod:`kz_runner.judge`): the kernel runs in a worker process of its own, and this
process, which never imports the package's source area, draws every call's inputs,
compares a secret sample of the outputs with ``reference`` and checks the worker's clock
against its own. A plain function is timed in this process, as before, only where no
judge was asked for (a benchmark run by hand, the unverified fallback).

Each ``with h.case(meta)`` block records one case; an exception inside it becomes
that case's ``error`` (accept false) instead of crashing the run, so stdout still
carries one valid document. ``finish`` judges every case (correctness passed and
the primary metric within the regression tolerance of the scorecard's best),
writes the document to the real stdout and returns the exit code.
"""
from __future__ import annotations

import ast
import importlib
import io
import json
import math
import os
import random
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn, TextIO

from kz_runner.bench import channel, device as _device, pristine
from kz_runner.bench.check import Check, check as _check
from kz_runner.bench.integrity import (
    HARNESS_ERROR,
    OUTPUT_TYPE,
    TIMER_TAMPERED,
    WEAK_TRIALS,
    Finding,
    Guard,
    IntegrityFailure,
)
from kz_runner.bench.output import build_document, case_result, write_document
from kz_runner.bench.scorecard import Scorecard, regression_check
from kz_runner.bench.timing import Timing, summarize, time_fn
from kz_runner.bench.trials import Trials, judge_inputs, mismatches
from kz_runner.contract.layout import BENCH_RESULT, KP, REFERENCE_DIR, REFERENCE_FILE

USAGE = "usage: benchmark.py <workdir>"
CPU_TRIALS = 4  # argument buffers rotated on the CPU, as many as the input copies it always rotated
# The judge's findings that void the run (an integrity finding: the runner reports the code), by the
# judge's code -> the code reported. The others are the case's error: a kernel that raises, crashes or
# hangs fails its case, as an exception in the case body always did.
JUDGE_VOIDS = {"WRONG_OUTPUT": "WRONG_OUTPUT", "TIMER_TAMPERED": TIMER_TAMPERED, "PROTOCOL_ERROR": "PROTOCOL_ERROR",
               "BAD_OUTPUT": OUTPUT_TYPE, "MACHINE_BUSY": "MACHINE_BUSY"}
# Times a judged timing is tried again when the machine was too busy to tell (MACHINE_BUSY): not a verdict.
BUSY_RETRIES = 2
# The judge's batches: at least this many (the spread of a figure is over the batches' means).
JUDGE_MIN_BATCHES = 8
JUDGE_DEVICE_ARENA_BYTES = 8 << 30  # a GPU case's judge arena: call slots for up to 8 GiB of inputs and outputs
# A confirmation run times the candidate and the operator's reference alternately, A B A B: the ratio
# is the median of the candidate's rounds over the median of the reference's. Each round is a whole judged
# timing (a fresh worker, its calibration): two rounds make a case cost four timings instead of one.
REFERENCE_ROUNDS = 2
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class KernelRef:
    """A kernel named, not imported: ``module`` (dotted, relative to the package's ``src/``) and ``function``."""

    module: str
    function: str

    def __str__(self) -> str:
        return f"src/{self.module.replace('.', '/')}.py:{self.function}"


def kernel(module: str, function: str) -> KernelRef:
    """Name the kernel ``function`` of ``src/<module>.py`` for :meth:`CaseRun.time`; nothing is imported.

    The benchmark's process never imports the package's source area: the judge starts a
    worker process that does, and times it from outside (:mod:`kz_runner.judge`).
    """
    if not (isinstance(module, str) and all(_IDENTIFIER.fullmatch(p) for p in module.split("."))):
        raise ValueError(f"module must be a dotted module name under src/, not {module!r}")
    if not (isinstance(function, str) and _IDENTIFIER.fullmatch(function)):
        raise ValueError(f"function must be a name, not {function!r}")
    return KernelRef(module, function)


class CaseFailure(Exception):
    """A finding that fails its case only (the kernel raised, crashed or hung in the judge's worker)."""


class Unjudged(BaseException):
    """The judge's step cannot time this harness (it needs the source area or a device the judge lacks):
    sent on the result channel as ``unjudged`` so the runner runs it again, unverified."""


def _import_kernel(ref: KernelRef, package_root: Path) -> Callable:
    """``ref``'s function imported into this process (the unverified, in-process form)."""
    src = str(Path(channel.worker_source() or package_root) / "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    return getattr(importlib.import_module(ref.module), ref.function)


def _read_reference(package_root: Path) -> dict[str, Any] | None:
    """``.kernel_package/reference/reference.json`` of a confirmation run's package, or None (not one)."""
    path = package_root / KP / REFERENCE_DIR / REFERENCE_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return {"status": "unavailable", "unavailable": f"{REFERENCE_FILE} is unreadable: {exc}"}
    return doc if isinstance(doc, dict) else {"status": "unavailable", "unavailable": f"{REFERENCE_FILE} is no object"}


def _defines(src: Path, module: str, function: str) -> bool:
    """Whether ``src/<module>.py`` (or its package's ``__init__.py``) binds ``function`` at top level.

    Read with ``ast``: the benchmark's process never imports a source area, the reference's included.
    """
    base = src.joinpath(*module.split("."))
    for path in (base.parent / (base.name + ".py"), base / "__init__.py"):
        try:
            tree = ast.parse(path.read_bytes())
        except (OSError, SyntaxError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == function:
                return True
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == function
                                                    for t in node.targets):
                return True
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == function:
                return True
            if isinstance(node, (ast.Import, ast.ImportFrom)) and \
                    any((a.asname or a.name.split(".")[0]) == function for a in node.names):
                return True
    return False


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class StdoutGuard:
    """Send everything written to fd 1 to stderr; keep the real stdout for the result.

    Native code or a stray ``print`` in the implementation then cannot corrupt the
    one JSON document the runner parses. ``stream`` writes to the saved stdout.
    """

    def __init__(self) -> None:
        self.stream: IO[str] | None = None
        self._saved_fd: int | None = None
        self._saved_sys_stdout: TextIO | None = None

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


def reference_ratio(timing: Timing, direction: str) -> dict[str, Any] | None:
    """``{value, lo, hi, rounds}`` of a primary metric over the reference's, from ``timing``'s time ratio.

    A time metric (``lower_better``) is proportional to the time, so its ratio is the time
    ratio; a rate (``higher_better``) is inversely proportional, so its ratio is the inverse.
    """
    ref = timing.reference
    if not ref or not (ref["time_ratio"] > 0 and ref["lo"] > 0 and ref["hi"] > 0):
        return None
    if direction == "higher_better":
        return {"value": 1.0 / ref["time_ratio"], "lo": 1.0 / ref["hi"], "hi": 1.0 / ref["lo"],
                "rounds": ref["rounds"]}
    return {"value": ref["time_ratio"], "lo": ref["lo"], "hi": ref["hi"], "rounds": ref["rounds"]}


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

        ``fn`` is a :func:`kernel` reference (the judged form) or, outside the judge's step,
        a function (timed in this process, unverified). Judged: the same arguments; the first
        call on ``inputs`` is the case's correctness check against ``expected``, then the
        judge times calls on inputs it draws from its own secret seed (the variation below, or
        ``vary``), compares a secret sample of them with ``reference`` (``WRONG_OUTPUT``) and
        bounds the worker's reported times by its own clock (``TIMER_TAMPERED``). ``out`` says
        the kernel takes an output buffer as its last argument (its shape from ``reference``).
        ``target_rse``, ``min_reps`` and ``budget_s`` apply; the figures are the clean batches'
        mean call times (see :class:`~kz_runner.bench.timing.Timing`).

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
        if isinstance(fn, KernelRef):
            timing = self._time_judged(fn, inputs, reference, expected, out, vary, settings)
            self.timings.append(timing)
            harness.log(f"case {self.id}: {timing.describe()} (judged)")
            harness.log("timing " + json.dumps({"test_case_id": self.id, **timing.to_json()}))
            return timing
        elif channel.judged():
            raise TypeError("in the judge's step a kernel is timed only through bench.kernel(module, function): "
                            f"{getattr(fn, '__qualname__', fn)!r} would run in the judge's own process")
        harness.unverified = True
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

    def _time_judged(self, ref: KernelRef, inputs: Sequence[Any] | None, reference: Callable | None,
                     expected: Any, out: Any, vary: Callable | None, settings: dict[str, Any]) -> Timing:
        """Check and time ``ref`` through the judge (see the module docstring); the findings are values."""
        import numpy as np

        harness = self.harness
        xp = harness.xp  # CuPy for a GPU case: its arrays stay on the device, in the judge's device arena
        args = tuple(inputs) if isinstance(inputs, (tuple, list)) else (() if inputs is None else (inputs,))
        base = tuple(xp.array(a) if hasattr(a, "__array__") and not np.isscalar(a) else a for a in args)
        tol = self.meta["tolerance"]
        atol, rtol = float(tol["correctness_atol"]), float(tol["correctness_rtol"])
        if reference is None:
            # Without a reference no drawn input can be checked: a result kept from the first call would pass.
            self._void(Finding(WEAK_TRIALS, "c.time has expected= but no reference=, so no timed call on fresh "
                               "inputs can be checked: give reference= (a trusted function of the inputs)",
                               self.id, {"reference": False, "vary": vary is not None}))
        expected0 = xp.asarray(expected) if expected is not None else xp.asarray(reference(*base))
        inputs_fn = judge_inputs(base, vary)
        varied = xp.asarray(reference(*inputs_fn(np.random.default_rng())))
        if varied.shape == expected0.shape and mismatches(xp, varied, expected0, atol, rtol) == 0:
            self._void(Finding(WEAK_TRIALS, "a varied trial input's expected output is within the case's tolerance "
                               "of the base inputs' (an order-independent result, inputs the variation does not "
                               "change, or a tolerance wider than the outputs): give vary= that changes the "
                               "result, or a tighter tolerance", self.id, {"reference": True,
                                                                           "vary": vary is not None}))
        prefix = channel.worker_sandbox()
        env = dict(os.environ)
        if prefix:  # the worker's view has its own /tmp and none of this process's folders
            env.update({"HOME": "/tmp", "TMPDIR": "/tmp"})
        root = Path(channel.worker_source() or harness.package_root)
        options = dict(atol=atol, rtol=rtol, first_inputs=base, first_expected=expected0,
                       calls=int(settings.get("min_reps", 10)), min_batches=JUDGE_MIN_BATCHES,
                       target_rse=float(settings.get("target_rse", 0.005)),
                       budget_s=float(settings.get("budget_s", 2.0)))
        if xp is not np:  # device memory is plentiful: enough call slots for batches of cold inputs
            options["arena_max_bytes"] = JUDGE_DEVICE_ARENA_BYTES
        later = dict(options, first_inputs=None, first_expected=None)
        out_mode = "out_pos" if out is not None else "return"
        target, why = harness.reference_kernel(ref) if harness.reference is not None else (None, "")
        results: list[Any] = []
        ref_results: list[Any] = []
        for round_no in range(REFERENCE_ROUNDS if target is not None else 1):
            result = self._judge_run(prefix, env, root / "src", ref, out_mode, inputs_fn, reference,
                                     options if round_no == 0 else later)
            if result is None:
                self._void(Finding(HARNESS_ERROR, f"the judge could not start the kernel's worker: {self._start_error}",
                                   self.id))
            if round_no == 0 and result.first_output is not None:
                first = result.first_output[0] if len(result.first_output) == 1 else tuple(result.first_output)
                self.check(first, expected0)
            for f in result.findings:
                evidence = {k: v for k, v in f.evidence.items() if isinstance(v, (int, float, str, bool, type(None)))}
                if f.code in JUDGE_VOIDS:
                    self._void(Finding(JUDGE_VOIDS[f.code], f.message, self.id, evidence))
                raise CaseFailure(f.line())
            results.append(result)
            if target is None or why:
                continue
            # the reference, timed the same way on the same distribution of inputs, right after
            other = self._judge_run(prefix, env, root / KP / REFERENCE_DIR / "src", target, out_mode, inputs_fn,
                                    reference, later)
            if other is None:
                why = f"the reference's worker did not start: {self._start_error}"
            elif other.findings:
                why = f"the reference kernel {target} did not time cleanly: {other.findings[0].line()}"[:500]
            elif not (other.batch_mean_median_ns > 0 and results[-1].batch_mean_median_ns > 0):
                why = "the reference kernel's timing has no clean batch"
            else:
                ref_results.append(other)
        clean = [m / 1e6 for r in results for m, ok in zip(r.batch_means_ns, r.clean) if ok] or \
            [m / 1e6 for r in results for m in r.batch_means_ns]
        if not clean:
            raise CaseFailure("HARNESS_ERROR: the judge timed no batch")
        ratio = None
        if target is not None and not why and len(ref_results) == len(results):
            mine = [r.batch_mean_median_ns for r in results]
            theirs = [r.batch_mean_median_ns for r in ref_results]
            value = _median(mine) / _median(theirs)
            per_round = [a / b for a, b in zip(mine, theirs)]
            ratio = {"kernel": str(target), "time_ratio": value, "lo": min(min(per_round), value),
                     "hi": max(max(per_round), value), "rounds": len(per_round)}
            harness.log(f"case {self.id}: {value:.4g}x the reference's time ({harness.reference_name()} "
                        f"{target}, {len(per_round)} rounds, {min(per_round):.4g}..{max(per_round):.4g})")
        elif target is not None or why:
            harness.reference_missing(self.id, why or "the reference was not timed")
        last = results[-1]
        return Timing(stats=summarize(clean), device="gpu" if xp is not np else "cpu", stop_reason=last.stop_reason or "batches",
                      target_rse=options["target_rse"], warmup_calls=0, rotations=int(last.overhead.get("slots", 1)),
                      l2_flush_bytes=0, elapsed_s=sum(r.timed_wall_s for r in results),
                      checked_calls=sum(r.compared for r in results),
                      judge={"batch_size": last.batch_size, "batches": sum(len(r.walls_ns) for r in results),
                             "clean_batches": sum(sum(r.clean) for r in results), "calls": sum(r.n for r in results),
                             "overhead_ns": round(last.overhead.get("batch_overhead_ns", 0.0)),
                             "elapsed_s": round(sum(r.elapsed_s for r in results), 4)},
                      reference=ratio)

    _start_error = ""

    def _judge_run(self, prefix: list[str], env: dict[str, str], src: Path, ref: KernelRef, out_mode: str,
                   inputs_fn: Callable, reference: Callable, options: dict[str, Any]) -> Any:
        """One ``Judge.time`` of ``ref`` from ``src`` (again when the machine was too busy); None when its
        worker could not start (``_start_error`` says why)."""
        from kz_runner.judge import Judge

        result = None
        for attempt in range(BUSY_RETRIES + 1):
            try:
                judge = Judge.start(prefix, src, ref.module, ref.function, out_mode=out_mode, env=env, harden=True)
            except RuntimeError as exc:
                self._start_error = str(exc)
                return None
            try:
                result = judge.time(inputs_fn, reference, **options)
            finally:
                judge.close()
            if result.codes != ["MACHINE_BUSY"] or attempt == BUSY_RETRIES:
                break
            self.harness.log(f"case {self.id}: the machine was too busy to judge the timing; again")
        return result

    def _void(self, finding: Finding) -> NoReturn:
        """Record ``finding`` on the harness (it voids the run) and stop the case."""
        self.harness._report_finding(finding)
        raise IntegrityFailure(finding)

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
        elif exc_type is not None and issubclass(exc_type, CaseFailure):
            self.error = str(exc)
            self.harness.log(f"case {self.id}: {exc}")
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
        kernel_id = kernel_id or self.scorecard.kernel_id
        if not kernel_id:
            raise ValueError(f"no kernel_id: pass kernel_id= or provide {card_path}")
        self.kernel_id: str = kernel_id
        self._log = log_stream
        self._out = out_stream
        self.timing_settings: dict[str, Any] = {"device": "cpu" if device == "cpu" else device}
        self.timing_settings.update(timing)
        self.results: list[dict[str, Any]] = []
        self._guard: StdoutGuard | None = None
        self.trial_seed = channel.trial_seed()  # the in-process (unverified) timing's; the judge draws its own
        self.finding: Finding | None = None  # the first integrity finding; it voids the run
        self.unverified = False  # set once a kernel was timed in this process (not by the judge)
        # a confirmation run's package names the operator's reference kernel: it is timed beside each case
        self.reference = _read_reference(self.package_root)
        self._reference_missing: dict[str, str] = {}  # case -> why it has no reference_ratio
        self._reference_timed: set[str] = set()  # the reference kernels timed, as src/<module>.py:<function>

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

    # -- the reference kernel of a confirmation run -----------------------------------

    def reference_name(self) -> str:
        """The reference kernel's kernel_id (or a placeholder when the package names none)."""
        return str((self.reference or {}).get("kernel_id") or "the reference")

    def reference_kernel(self, ref: KernelRef) -> tuple[KernelRef | None, str]:
        """The reference's kernel to time beside ``ref``, or (None, why not).

        The same module and function when the reference's source area defines it (read with
        ``ast``); else the one kernel the reference's own benchmark names with ``bench.kernel``
        (or the one of them with ``ref``'s function name).
        """
        doc = self.reference or {}
        if doc.get("status") != "available":
            return None, str(doc.get("unavailable") or "the package names no reference kernel")
        src = self.package_root / KP / REFERENCE_DIR / "src"
        if _defines(src, ref.module, ref.function):
            return ref, ""
        declared = []
        for pair in doc.get("kernels") or []:
            try:
                declared.append(kernel(*pair))
            except (TypeError, ValueError):
                continue
        pick = declared[0] if len(declared) == 1 else next((k for k in declared if k.function == ref.function), None)
        if pick is not None and _defines(src, pick.module, pick.function):
            return pick, ""
        return None, (f"the reference kernel {self.reference_name()} defines no {ref} and its benchmark names no "
                      "kernel of its own that it defines")

    def reference_missing(self, case_id: str, why: str) -> None:
        """Record why ``case_id`` carries no reference ratio (said in the document's ``reference``)."""
        self._reference_missing.setdefault(case_id, why)
        self.log(f"case {case_id}: reference unavailable: {why}")

    def _reference_doc(self, ratios: int) -> dict[str, Any] | None:
        """The document's ``reference``: which kernel was timed, and whether any case has a ratio."""
        if self.reference is None:
            return None
        doc: dict[str, Any] = {"status": "measured" if ratios else "unavailable"}
        for key in ("kernel_id", "commit"):
            if isinstance(self.reference.get(key), str):
                doc[key] = self.reference[key]
        if self._reference_timed:
            doc["kernel"] = ", ".join(sorted(self._reference_timed))[:300]
        if self._reference_missing:
            doc["reason"] = "; ".join(f"{k}: {v}" for k, v in self._reference_missing.items())[:2000]
        elif not ratios:
            doc["reason"] = str(self.reference.get("unavailable") or "no case was timed by the judge")[:2000]
        return doc

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
        ratio = None
        if primary in metrics and primary in run.metric_timings:
            spread = metric_spread(metrics[primary], run.metric_timings[primary],
                                   directions.get(primary, "lower_better"))
            if spread is not None:
                spreads[primary] = spread
            ratio = reference_ratio(run.metric_timings[primary], directions.get(primary, "lower_better"))
            if ratio is not None:
                self._reference_timed.add(run.metric_timings[primary].reference["kernel"])  # type: ignore[index]
        if self.reference is not None and ratio is None and run.id not in self._reference_missing:
            self._reference_missing[run.id] = "its primary metric was not recorded after a judged timing"
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
            assert run.checked is not None  # without a check, errors holds why: the branch above
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
                reference_ratio=ratio,
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
        ratios = sum(1 for r in self.results if "reference_ratio" in r)
        return build_document(self.kernel_id, self.results, arch=arch, accept_reason=reason[:2000],
                              reference=self._reference_doc(ratios))

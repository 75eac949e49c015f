"""Checked timing: varied trial inputs, poisoned outputs, and the timed calls' outputs checked.

:class:`Trials` prepares, from a case's base inputs, ``count`` trial contents: the base
inputs themselves and ``count - 1`` seeded variations of them (each array argument's
elements cyclically shifted by a seeded offset, unless the benchmark gives ``vary``),
with the expected output of each computed by the benchmark's trusted ``reference``
(the base inputs use ``expected`` when given). The seed is the runner's, which the
package cannot know, so results cached from an earlier call, or keyed on the inputs'
identity or shape, are wrong for the next trial.

Every call (warm-up and timed) runs on one of ``count`` argument buffers. Before the
call the buffer is refilled with a trial content other than the one it held and the
output buffer (when the benchmark passes one) is filled with a poison pattern (NaN for
floats, a fixed odd value for integers), outside the timed interval. After the call the
output's exact type, dtype and shape are checked (``OUTPUT_TYPE``), and a seeded
sample of the timed calls has its output compared with the expected output of the
content it was given: the poison or another trial's output is ``STALE_OUTPUT``, any
other error ``TIMED_MISMATCH``, reported at the end of the batch unless the timer,
thread or event/wall checks found the cause first. On the CPU the comparison writes into
buffers allocated once (:class:`Scratch`), so nothing the harness does between two timed
calls changes the C heap the next call allocates from.
"""
from __future__ import annotations

import random
from typing import Any, Callable, Sequence

import numpy as np

from kz_runner.bench import pristine
from kz_runner.bench.integrity import OUTPUT_TYPE, STALE_OUTPUT, TIMED_MISMATCH, Finding

# Share of the timed calls whose output is compared: a quarter of the first 32, then one in 16,
# at most MAX_CHECKS per timing. A package that is fast by being wrong on more than half of the
# calls (what moving the median needs) escapes 16 checks with probability 2**-16.
EARLY_CALLS, EARLY_P, LATE_P, MAX_CHECKS = 32, 0.25, 1 / 16, 48
# An output counts as stale when at least this share of it is poison or another trial's result.
STALE_SHARE = 0.9


def poison_value(dtype: Any) -> Any:
    """The poison an output buffer of ``dtype`` is filled with before each call."""
    dtype = np.dtype(dtype)
    if dtype.kind in "fc":
        return np.nan
    if dtype.kind == "b":
        return True
    if dtype.kind in "iu":
        return np.iinfo(dtype).max - 0x25
    raise ValueError(f"no poison pattern for dtype {dtype}")


def shift_inputs(rng: random.Random, inputs: Sequence[Any], xp: Any) -> tuple:
    """The default variation: each array argument's elements cyclically shifted by a seeded offset."""
    varied = []
    for arg in inputs:
        size = getattr(arg, "size", 0)
        if _is_array(arg) and size > 1:
            shift = rng.randrange(1, size)
            varied.append(xp.roll(arg.reshape(-1), shift).reshape(arg.shape))
        else:
            varied.append(arg)
    return tuple(varied)


def _is_array(value: Any) -> bool:
    return type(value).__name__ == "ndarray" and hasattr(value, "shape") and hasattr(value, "dtype")


class Scratch:
    """Host buffers, allocated once, that the output comparisons write into.

    Comparing a timed call's output on the CPU would otherwise allocate and free several
    float64 temporaries of the output's size between two timed calls. Those frees move the
    C allocator's heap top and thresholds, and the next timed call then pays page faults
    for its own allocations: the harness, not the kernel, would be measured (seen as 5-8x
    the page faults per call of a plain loop for the CPU softmax example).
    """

    KINDS = "biuf"  # dtypes compared through the scratch (complex outputs take the allocating path)

    def __init__(self, shape: tuple) -> None:
        self.diff = np.empty(shape, dtype=np.float64)
        self.bound = np.empty(shape, dtype=np.float64)
        self.ok = np.empty(shape, dtype=np.bool_)
        self.flag = np.empty(shape, dtype=np.bool_)
        self.same = np.empty(shape, dtype=np.bool_)

    def fits(self, got: Any, expected: Any) -> bool:
        """Whether both arrays are host arrays of this shape with a dtype compared here."""
        return all(type(a) is np.ndarray and a.shape == self.ok.shape and a.dtype.kind in self.KINDS
                   for a in (got, expected))


def mismatches(xp: Any, got: Any, expected: Any, atol: float, rtol: float, scratch: Scratch | None = None) -> int:
    """Elements of ``got`` outside ``atol + rtol*|expected|`` (on the arrays' own device).

    With a fitting ``scratch`` the same comparison runs without allocating.
    """
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf and NaN are counted, not warned about
        if scratch is None or not scratch.fits(got, expected):
            g = got.astype(xp.float64)
            e = expected.astype(xp.float64)
            ok = xp.abs(g - e) <= atol + rtol * xp.abs(e)
            ok |= xp.isinf(g) & (g == e)
            return int(ok.size - int(xp.count_nonzero(ok)))
        d, b, ok, flag, same = scratch.diff, scratch.bound, scratch.ok, scratch.flag, scratch.same
        np.subtract(got, expected, out=d, dtype=np.float64)
        np.absolute(d, out=d)
        np.absolute(expected, out=b, dtype=np.float64)
        np.multiply(b, rtol, out=b)
        np.add(b, atol, out=b)
        np.less_equal(d, b, out=ok)
        np.isinf(got, out=flag)
        np.equal(got, expected, out=same)
        np.logical_and(flag, same, out=flag)
        np.logical_or(ok, flag, out=ok)
        return int(ok.size - int(np.count_nonzero(ok)))


def poisoned(xp: Any, got: Any, scratch: Scratch | None = None) -> int:
    """Elements of ``got`` that still hold the poison pattern (without allocating, given a fitting ``scratch``)."""
    value = poison_value(got.dtype)
    if scratch is not None and scratch.fits(got, got):
        if got.dtype.kind == "f":
            np.isnan(got, out=scratch.flag)
        else:
            np.equal(got, value, out=scratch.flag)
        return int(np.count_nonzero(scratch.flag))
    if got.dtype.kind in "fc":
        return int(xp.count_nonzero(xp.isnan(got)))
    return int(xp.count_nonzero(got == value))


class Trials:
    """The buffers, trial contents and checks of one checked timing (see the module docstring)."""

    def __init__(
        self,
        xp: Any,
        inputs: Sequence[Any],
        *,
        expected: Any,
        reference: Callable[..., Any] | None,
        out: Any,
        count: int,
        rng: random.Random,
        atol: float,
        rtol: float,
        vary: Callable[[random.Random, tuple], tuple] | None = None,
    ) -> None:
        if expected is None and reference is None:
            raise ValueError("a checked timing needs expected= or reference=")
        self.xp = xp
        self.array_type = pristine.cupy_ndarray if xp is pristine.cupy and xp is not None else np.ndarray
        self.atol, self.rtol = float(atol), float(rtol)
        self.rng = rng
        base = tuple(inputs)
        if reference is None:
            count = 1  # nothing can compute another trial's expectation
        self.count = max(1, int(count))
        contents = [base]
        for _ in range(self.count - 1):
            contents.append(tuple(vary(rng, base)) if vary is not None else shift_inputs(rng, base, xp))
        first = reference(*base) if expected is None else expected
        self.expected = [xp.asarray(first)] + [xp.asarray(reference(*c)) for c in contents[1:]]
        self.dtype, self.shape = self.expected[0].dtype, tuple(self.expected[0].shape)
        self.scratch = Scratch(self.shape) if xp is np else None
        self.contents = [tuple(_copy(a) for a in c) for c in contents]
        buffers = [tuple(_copy(a) for a in c) for c in self.contents]
        self.holds = list(range(self.count))  # which trial content each buffer holds now
        self.outs = [xp.empty_like(out) for _ in range(self.count)] if out is not None else None
        self.sets = [b + (self.outs[j],) if self.outs is not None else b for j, b in enumerate(buffers)]
        self.trial_of_call: dict[int, int] = {}
        self.checked_calls = 0
        self._timed_from: int | None = None
        self._poison = poison_value(self.dtype) if out is not None else None
        self.guard: Any = None
        self.pending: Finding | None = None  # the first wrong timed output, reported after the batch

    # -- the untimed check ---------------------------------------------------------------

    def first_call(self, fn: Callable) -> Any:
        """One untimed call on the base inputs (poisoned output); returns its output."""
        args = self.before(-1, self.sets[0], content=0)
        return self.output(fn(*args), args)

    # -- per call, used by the clocks --------------------------------------------------------

    def calibration(self) -> "_Calibration":
        """The same refill and poison around each call, without checks (for the clock's calibration)."""
        return _Calibration(self)

    def start_timing(self, first_call: int) -> None:
        """Calls from ``first_call`` on are timed (earlier ones were warm-up)."""
        self._timed_from = first_call

    def selected(self, idx: int) -> bool:
        """Whether timed call ``idx`` has its output compared (seeded, unpredictable to the package)."""
        if self._timed_from is None or idx < self._timed_from or self.checked_calls >= MAX_CHECKS:
            return False
        p = EARLY_P if idx - self._timed_from < EARLY_CALLS else LATE_P
        return self.rng.random() < p

    def before(self, idx: int, args: tuple, content: int | None = None) -> tuple:
        """Refill the buffer ``args`` with another trial content and poison its output buffer."""
        j = next(i for i, s in enumerate(self.sets) if s is args)
        if content is None:
            content = self.holds[j]
            if self.count > 1:
                content = self.rng.choice([t for t in range(self.count) if t != self.holds[j]])
        if content != self.holds[j]:
            for dst, src in zip(self.sets[j], self.contents[content]):
                if _is_array(dst):
                    self.xp.copyto(dst, src)
            self.holds[j] = content
        self.trial_of_call[idx] = content
        if self.outs is not None:
            self.outs[j].fill(self._poison)
        return args

    def output(self, returned: Any, args: tuple) -> Any:
        """The call's output: what it returned, or the output buffer when it returned None."""
        return args[-1] if returned is None and self.outs is not None else returned

    def after(self, idx: int, returned: Any, args: tuple, compare: bool) -> None:
        """Check the output's type (every call) and, when ``compare``, its values."""
        out = self.output(returned, args)
        self.check_type(out)
        if compare:
            # Timer and threads first: work finished by a thread, or a clock replaced, explains a wrong output.
            self.guard.check_timer()
            self.guard.check_threads()
            self.checked_calls += 1
            finding = self.check_values(out, self.trial_of_call.pop(idx, None))
            if finding is not None and self.pending is None:
                # Reported at the batch's end, after the event/wall cross-check: work escaping the
                # timed stream also races the poison fill, and its cause is the better finding.
                self.pending = finding
        else:
            self.trial_of_call.pop(idx, None)

    # -- the checks ----------------------------------------------------------------------

    def check_type(self, out: Any) -> None:
        """OUTPUT_TYPE unless ``out`` is exactly the array type, dtype and shape expected."""
        problem = None
        if type(out) is not self.array_type:
            kind = type(out)
            problem = f"is a {kind.__module__}.{kind.__qualname__}, not exactly " \
                      f"{self.array_type.__module__}.{self.array_type.__qualname__}"
        elif out.dtype != self.dtype:
            problem = f"has dtype {out.dtype}, expected {self.dtype}"
        elif tuple(out.shape) != self.shape:
            problem = f"has shape {tuple(out.shape)}, expected {self.shape}"
        if problem is not None:
            self.guard.fail(Finding(OUTPUT_TYPE, f"the output {problem}",
                                    evidence={"type": f"{type(out).__module__}.{type(out).__qualname__}",
                                              "dtype": str(getattr(out, "dtype", None)),
                                              "shape": list(getattr(out, "shape", []) or [])}))

    def check_values(self, out: Any, trial: int | None) -> Finding | None:
        """None when ``out`` matches trial ``trial``'s expectation, else the finding."""
        if trial is None:
            return None
        xp = self.xp
        size = int(out.size)
        wrong = mismatches(xp, out, self.expected[trial], self.atol, self.rtol, self.scratch)
        if wrong == 0:
            return None
        evidence = {"trial": trial, "mismatches": wrong, "checked": size, "checked_calls": self.checked_calls}
        if self.outs is not None and size and poisoned(xp, out, self.scratch) >= STALE_SHARE * size:
            return Finding(STALE_OUTPUT, f"a timed call left {wrong} of {size} output elements as the poison "
                           "written before the call: the output was not computed", evidence=evidence)
        for other, exp in enumerate(self.expected):
            if other != trial and mismatches(xp, out, exp, self.atol, self.rtol, self.scratch) <= \
                    (1 - STALE_SHARE) * size:
                return Finding(STALE_OUTPUT, f"a timed call on trial {trial}'s inputs returned trial {other}'s "
                               "result: a reused buffer or a cached result", evidence=dict(evidence, matches=other))
        return Finding(TIMED_MISMATCH, f"a timed call's output is wrong ({wrong} of {size} elements outside "
                       "the tolerance) although the untimed check passed", evidence=evidence)


class _Calibration:
    """Trials' per-call preparation without its checks."""

    def __init__(self, trials: Trials) -> None:
        self.trials = trials

    def before(self, idx: int, args: tuple) -> tuple:
        """Refill and poison as for a real call."""
        args = self.trials.before(idx, args)
        self.trials.trial_of_call.pop(idx, None)
        return args

    def selected(self, idx: int) -> bool:
        """Never compared."""
        return False

    def after(self, idx: int, returned: Any, args: tuple, compare: bool) -> None:
        """Nothing to check."""


def _copy(value: Any) -> Any:
    return value.copy() if _is_array(value) else value

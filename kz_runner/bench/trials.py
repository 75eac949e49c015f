"""Checked timing: fresh trial inputs on every call, poisoned outputs, and timed outputs checked.

Every call (warm-up and timed) runs on one of ``count`` argument buffers. Right before
the call, outside the timed interval, the buffer is refilled with a fresh trial content
and the output buffer (when the benchmark passes one) is filled with a poison pattern
(NaN for floats, a fixed odd value for integers). A trial content is the case's base
inputs varied by a seed drawn for that call from the runner's seed, which the package
cannot know: each array argument's elements cut into three blocks at seeded points and
put back in reverse block order, every block moved off its rows, and each floating-point
element multiplied by its own factor in [0.875, 1) (:func:`permute_into`: about
``n**2 / 2`` arrangements times ``2**21`` factor keys), unless the benchmark gives ``vary``.
Contents never repeat, nor does a single row of a float array, so a result cached from an
earlier call, keyed on the inputs' identity, shape, full content or any one float row's
bytes, is never reused: the cache only adds its own cost. (Integer rows, only moved, do
recur across calls: see docs/dev-notes.md, Known limitations.)

After the call the output's exact type, dtype and shape are checked (``OUTPUT_TYPE``),
and a seeded sample of the timed calls has its output copied aside; at the end of the
batch each copy is compared with what the benchmark's trusted ``reference`` computes for
that call's content (the base inputs use ``expected`` when given), so the reference's
own work never sits between two timed calls. The poison or the result of an earlier
call's inputs is ``STALE_OUTPUT``, any other error ``TIMED_MISMATCH``, reported after
the batch's timer, thread and event/wall checks, which name a cause first.
Time spent checking does not count against the timing's budget. On the CPU the
comparison itself writes into buffers allocated once (:class:`Scratch`).

The checks are only as strong as the variation: when the first checked call's expected
output is within the tolerance of the base inputs' (an order-independent result of
integer inputs such as a histogram, inputs the variation leaves as they were, a tolerance
wider than the outputs), or when there is no ``reference`` to vary against, a result kept
from the first call would pass them all, and the timing ends in ``WEAK_TRIALS`` (the
harness's to fix).
"""
from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kz_runner.bench import pristine
from kz_runner.bench.integrity import OUTPUT_TYPE, STALE_OUTPUT, TIMED_MISMATCH, WEAK_TRIALS, Finding

# Share of the timed calls whose output is compared: a quarter of the first 32, then one in 16,
# at most MAX_CHECKS per timing. A package that is fast by being wrong on more than half of the
# calls (what moving the median needs) escapes 16 checks with probability 2**-16.
EARLY_CALLS, EARLY_P, LATE_P, MAX_CHECKS = 32, 0.25, 1 / 16, 48
# Sampled outputs are copied aside and checked at the end of their batch (the reference's own
# allocations then never sit between two timed calls); the copies held at once use at most this
# much memory (at least one copy, which may be more).
EVIDENCE_BYTES = 256 << 20
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


# Every block moves (the order is R Q P) by a shift that is not a whole number of rows (see
# block_cuts), so no row of the base inputs (the untimed call's) is a row of a timed call's.
# Moving values is not enough across calls, though: the shifts of the base rows' windows
# repeat within a few hundred calls, and a source area that keeps every row it has seen,
# keyed on the row's bytes, found a third of the CPU softmax's rows again (keyed on a row's
# sorted bytes, it would beat any permutation of an op that commutes with one). So every
# element of a floating-point array is also multiplied by its own factor in [0.875, 1),
# drawn for the call: a row's content then never comes back. Factors towards zero keep the
# sign, the zeros and any range that contains 0 (probabilities stay probabilities);
# integers and booleans (indices, masks) are only moved.
#
# The factor of output element p is a float32 whose bits are FACTOR_HIGH (0.875) with the low
# FACTOR_BITS taken from a hash of p, xor-ed with the call's key: on a GPU the hash is
# computed in the permutation's own kernel (as many launches as a plain copy, so the per-call
# preparation stays as cheap as the input copies the harness always rotated), on the CPU it
# is a table computed once per timing and one xor per call (nothing allocated per call). The
# two give the same bits, and so the same products.
FACTOR_HIGH, FACTOR_BITS = 0x3F600000, 21
# Draws of the cuts before one with every shift off the rows is given up on (a row of 2
# elements has none: two odd cuts add up to an even shift).
CUT_TRIES = 16

# Output element p takes source element s, cuts at a <= b of n (R Q P: the blocks [b, n),
# [a, b), [0, a)); floats are scaled by the factor of p (lowbias32 of p folded to 32 bits).
_FACTOR_CODE = """
unsigned long long q = (unsigned long long)i;
unsigned int h = (unsigned int)(q ^ (q >> 32));
h ^= h >> 16; h *= 0x7feb352dU; h ^= h >> 15; h *= 0x846ca68bU; h ^= h >> 16;
float m = __uint_as_float(((h >> %d) | 0x%XU) ^ key);
""" % (32 - FACTOR_BITS, FACTOR_HIGH)
_SOURCE_CODE = """
long long p = i, s;
if (p < n - b) s = b + p; else if (p < n - a) s = a + (p - (n - b)); else s = p - (n - a);
"""


def _gpu_kernel(name: str, params: str, code: str) -> Any:
    return pristine.cupy.ElementwiseKernel(params, "T dst", code, name) if pristine.cupy is not None else None


_GPU_PERMUTE = _gpu_kernel("kz_block_permute", "raw T src, int64 n, int64 a, int64 b",
                           _SOURCE_CODE + "dst = src[s];")
# float16 and float32 multiply in float32 and float64 in float64, as NumPy does with a float32 factor
_GPU_PERMUTE_SCALE = {wide: _gpu_kernel(f"kz_block_permute_scale_{wide}",
                                        "raw T src, int64 n, int64 a, int64 b, uint32 key",
                                        _SOURCE_CODE + _FACTOR_CODE + f"dst = (T)(({wide})src[s] * ({wide})m);")
                      for wide in ("float", "double")}


def block_cuts(rng: random.Random, n: int, row: int | None = None) -> tuple[int, int]:
    """Two seeded cut points ``0 < a < b < n`` (``(1, 1)`` when n < 3: two elements swap).

    ``row`` (default ``n``): the length of a row, the array's last dimension. In R Q P the
    blocks move by ``-b``, ``n - a - b`` and ``n - a``; the cuts are drawn again (up to
    CUT_TRIES times) until none of these is a whole number of rows, so that no row of the
    base inputs reappears, even at another place; nor does any larger unit a package may
    work in (a head, a batch), being a whole number of rows.
    """
    if n < 3:
        return 1, 1
    row = row or n
    for _ in range(CUT_TRIES):
        a = rng.randrange(1, n - 1)
        b = rng.randrange(a + 1, n)
        if a % row and b % row and (a + b) % row:
            break
    return a, b


def _hash32(index: np.ndarray) -> np.ndarray:
    """_FACTOR_CODE's hash of each element's index, on the host (uint32, wrapping as in CUDA)."""
    q = index.astype(np.uint64)
    h = (q ^ (q >> np.uint64(32))).astype(np.uint32)
    for shift, mult in ((16, 0x7FEB352D), (15, 0x846CA68B)):
        h ^= h >> np.uint32(shift)
        np.multiply(h, np.uint32(mult), out=h)
    h ^= h >> np.uint32(16)
    return h


class Factors:
    """The host's per-element factors: the hashed bits of each size's indices, computed once."""

    def __init__(self) -> None:
        self._tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # n -> (high bits | hash, scratch)

    def prepare(self, n: int) -> None:
        """Compute the table for arrays of ``n`` elements (before the timing: it allocates)."""
        if n not in self._tables:
            table = (_hash32(np.arange(n, dtype=np.uint64)) >> np.uint32(32 - FACTOR_BITS)) | np.uint32(FACTOR_HIGH)
            self._tables[n] = (table, np.empty(n, dtype=np.uint32))

    def draw(self, n: int, key: int) -> np.ndarray:
        """The ``n`` factors of ``key`` (float32, in a buffer the next draw for this size overwrites)."""
        self.prepare(n)
        table, out = self._tables[n]
        np.bitwise_xor(table, np.uint32(key), out=out)
        return out.view(np.float32)


def scaled(dtype: Any) -> bool:
    """Whether arrays of ``dtype`` have their elements multiplied by factors (floating point only)."""
    return np.dtype(dtype).kind == "f"


def permute_into(xp: Any, dst: Any, src: Any, rng: random.Random, factors: Factors | None = None) -> None:
    """Write into ``dst`` the elements of ``src`` cut into three blocks at two seeded points and
    put back in reverse block order, each multiplied by its factor when floating point (both
    C-contiguous, same size). On a GPU nothing is allocated; on the host nothing either when
    ``factors`` was prepared for this size (without it a table is made for this call).

    The arrangement is one of about ``n**2 / 2`` (n elements), and no row (last dimension)
    of ``src`` is a row of ``dst`` (see :func:`block_cuts`); with the factors no row of any
    earlier content comes back either.
    """
    d, s = dst.reshape(-1), src.reshape(-1)
    n = int(s.size)
    if n == 0:
        return
    a, b = block_cuts(rng, n, _row_length(src.shape))
    key = rng.getrandbits(FACTOR_BITS)
    scale = scaled(s.dtype)
    if xp is not np and _GPU_PERMUTE is not None:
        if scale:
            _GPU_PERMUTE_SCALE["double" if s.dtype == np.float64 else "float"](s, n, a, b, np.uint32(key), d)
        else:
            _GPU_PERMUTE(s, n, a, b, d)
        return
    m = (factors or Factors()).draw(n, key) if scale else None
    pos = 0
    for lo, hi in ((b, n), (a, b), (0, a)):
        if m is None:
            xp.copyto(d[pos:pos + hi - lo], s[lo:hi])
        else:
            np.multiply(s[lo:hi], m[pos:pos + hi - lo], out=d[pos:pos + hi - lo])
        pos += hi - lo


def _row_length(shape: tuple) -> int | None:
    """The last dimension longer than 1 (None for a scalar)."""
    return next((int(d) for d in reversed(shape) if d > 1), None)


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


_UNSET = object()


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
        self.reference, self.vary = reference, vary
        self.base = tuple(_copy(a) for a in inputs)
        if expected is None:
            assert reference is not None  # checked above
            expected = reference(*self.base)
        first = expected
        self.expected0 = xp.asarray(first)  # the base inputs' expectation
        self.dtype, self.shape = self.expected0.dtype, tuple(self.expected0.shape)
        self.scratch = Scratch(self.shape) if xp is np else None
        self.factors = Factors() if xp is np else None  # the host's per-element factors, prepared here
        if self.factors is not None and vary is None:
            for a in self.base:
                if _is_array(a) and scaled(a.dtype):
                    self.factors.prepare(int(a.size))
        self.count = max(1, int(count))
        buffers = [tuple(_copy(a) for a in self.base) for _ in range(self.count)]
        self._check_set = tuple(_copy(a) for a in self.base)  # where a call's content is rebuilt for its check
        self.holds: list[int | None] = [None] * self.count  # the seed of each buffer's content (None: base)
        self._first: list[Any] = [_UNSET] * self.count  # the seed of each buffer's first content
        self.outs = [xp.empty_like(out) for _ in range(self.count)] if out is not None else None
        self.sets = [b + (self.outs[j],) if self.outs is not None else b for j, b in enumerate(buffers)]
        self.seed_of_call: dict[int, int | None] = {}
        self.earlier: dict[int, tuple] = {}  # call -> seeds a stale output could come from
        self._last_seed: int | None = None
        self.checked_calls = 0
        self.spent_s = 0.0  # time spent checking outputs (not part of the timing's budget)
        out_bytes = int(self.expected0.nbytes)
        self.max_held = max(1, min(MAX_CHECKS, EVIDENCE_BYTES // max(out_bytes, 1)))
        self._held: list[tuple[Any, int | None, tuple]] = []  # (copy of the output, its seed, earlier seeds)
        self._spare: list[Any] = []  # copies already checked, reused
        self._timed_from: int | None = None
        self._poison = poison_value(self.dtype) if out is not None else None
        self.guard: Any = None
        self.pending: Finding | None = None  # the first wrong timed output, reported after the batch
        # Whether a varied content's expectation differs from the base inputs' (None: not known
        # yet). Without a reference every call gets the base inputs: nothing varies.
        self.varies: bool | None = None if reference is not None else False

    # -- the contents ----------------------------------------------------------------------

    def fill(self, dst: tuple, seed: int | None) -> None:
        """Write the content of ``seed`` (None: the base inputs) into the argument buffers ``dst``."""
        xp = self.xp
        if seed is None or self.reference is None:
            varied = self.base
        elif self.vary is not None:
            varied = tuple(self.vary(random.Random(seed), self.base))
        else:
            rng = random.Random(seed)
            for d, b in zip(dst, self.base):
                if _is_array(d):
                    permute_into(xp, d, b, rng, self.factors)
            return
        for d, v in zip(dst, varied):
            if _is_array(d):
                xp.copyto(d, v)

    def expected_for(self, seed: int | None) -> Any:
        """The expected output of the content of ``seed``, from the trusted reference."""
        if seed is None or self.reference is None:
            return self.expected0
        self.fill(self._check_set, seed)
        return self.xp.asarray(self.reference(*self._check_set))

    # -- the untimed check ---------------------------------------------------------------

    def first_call(self, fn: Callable) -> Any:
        """One untimed call on the base inputs (poisoned output); returns its output."""
        args = self.before(-1, self.sets[0], base=True)
        self.prepared(-1)
        return self.output(fn(*args), args)

    # -- per call, used by the clocks --------------------------------------------------------

    def calibration(self) -> _Calibration:
        """The same refill and poison around each call, without checks (for the clock's calibration)."""
        return _Calibration(self)

    def start_timing(self, first_call: int) -> None:
        """Calls from ``first_call`` on are timed (earlier ones were warm-up)."""
        self._timed_from = first_call

    def selected(self, idx: int) -> bool:
        """Whether timed call ``idx`` has its output compared (seeded, unpredictable to the package)."""
        if self._timed_from is None or idx < self._timed_from or self.checked_calls >= MAX_CHECKS \
                or len(self._held) >= self.max_held:
            return False
        p = EARLY_P if idx - self._timed_from < EARLY_CALLS else LATE_P
        return self.rng.random() < p

    def before(self, idx: int, args: tuple, base: bool = False) -> tuple:
        """Refill the buffer ``args`` with a fresh content (``base``: the base inputs) and poison its output."""
        j = next(i for i, s in enumerate(self.sets) if s is args)
        seed = None if base or self.reference is None else self.rng.getrandbits(63)
        if self._first[j] is _UNSET:
            self._first[j] = seed
        # what a stale output could be the result of: the buffer's last and first contents (a cache
        # keyed on the buffer), the previous call's (a result kept from the last call)
        self.earlier[idx] = (self.holds[j], self._first[j], self._last_seed)
        self.fill(args, seed)
        self.holds[j] = self._last_seed = self.seed_of_call[idx] = seed
        if self.outs is not None:
            self.outs[j].fill(self._poison)
        return args

    def prepared(self, idx: int) -> tuple[int | None, tuple]:
        """What :meth:`before` noted for call ``idx`` (its content's seed, the earlier seeds), forgotten."""
        return self.seed_of_call.pop(idx, None), self.earlier.pop(idx, ())

    def output(self, returned: Any, args: tuple) -> Any:
        """The call's output: what it returned, or the output buffer when it returned None."""
        return args[-1] if returned is None and self.outs is not None else returned

    def after(self, idx: int, returned: Any, args: tuple, compare: bool) -> None:
        """Check the output's type (every call) and, when ``compare``, keep a copy to check its values."""
        out = self.output(returned, args)
        self.check_type(out)
        seed, earlier = self.prepared(idx)
        if compare:
            # Timer and threads first: work finished by a thread, or a clock replaced, explains a wrong output.
            self.guard.check_timer()
            self.guard.check_threads()
            self.checked_calls += 1
            held = self._spare.pop() if self._spare else self.xp.empty(self.shape, dtype=self.dtype)
            self.xp.copyto(held, out)
            self._held.append((held, seed, earlier))

    def verify(self) -> None:
        """Compare the outputs kept since the last verify (at a batch's end, outside the timed calls).

        The first wrong one becomes :attr:`pending`, reported after the batch's other checks:
        work escaping the timed stream also races the poison fill, and its cause is the better finding.
        """
        if self._held:
            t0 = pristine.perf_counter()
            for held, seed, earlier in self._held:
                finding = self.check_values(held, seed, earlier)
                if finding is not None and self.pending is None:
                    self.pending = finding
                self._spare.append(held)
            self._held.clear()
            self.spent_s += pristine.perf_counter() - t0
        if self.varies is False and self.pending is None:
            self.pending = self._weak_trials()

    def _weak_trials(self) -> Finding:
        """WEAK_TRIALS: the timed calls' checks could not tell the first call's result from a computed one."""
        if self.reference is None:
            why = ("the checked timing has expected= but no reference=, so every call gets the base inputs "
                   "and a result kept from the first call cannot be told from a computed one: give reference= "
                   "(a trusted function of the inputs)")
        else:
            why = ("a varied trial input's expected output is within the case's tolerance of the base inputs' "
                   "(an order-independent result such as a sum or a sort, inputs the variation does not "
                   "change, or a tolerance wider than the outputs), so a result kept from the first call "
                   "cannot be told from a computed one: give vary= that changes the result, or a tighter "
                   "tolerance")
        return Finding(WEAK_TRIALS, why, evidence={"reference": self.reference is not None,
                                                   "vary": self.vary is not None,
                                                   "checked_calls": self.checked_calls})

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

    def check_values(self, out: Any, seed: int | None, earlier: Sequence[int | None] = ()) -> Finding | None:
        """None when ``out`` matches the expectation of content ``seed``, else the finding.

        ``earlier``: the contents a stale output could be the result of (what the buffer held
        before and first, the previous call's); matching one of them or the base inputs' is
        ``STALE_OUTPUT``.
        """
        xp = self.xp
        size = int(out.size)
        expected = self.expected_for(seed)
        if self.varies is None and seed is not None:  # once: does the variation change the result at all?
            self.varies = mismatches(xp, expected, self.expected0, self.atol, self.rtol, self.scratch) > 0
        wrong = mismatches(xp, out, expected, self.atol, self.rtol, self.scratch)
        if wrong == 0:
            return None
        evidence = {"mismatches": wrong, "checked": size, "checked_calls": self.checked_calls}
        if self.outs is not None and size and poisoned(xp, out, self.scratch) >= STALE_SHARE * size:
            return Finding(STALE_OUTPUT, f"a timed call left {wrong} of {size} output elements as the poison "
                           "written before the call: the output was not computed", evidence=evidence)
        for other in dict.fromkeys((*earlier, None)):  # None: the base inputs (the untimed call's)
            if other != seed and mismatches(xp, out, self.expected_for(other), self.atol, self.rtol,
                                            self.scratch) <= (1 - STALE_SHARE) * size:
                return Finding(STALE_OUTPUT, "a timed call returned the result of inputs an earlier call was "
                               "given: a reused buffer or a cached result",
                               evidence=dict(evidence, matches="base inputs" if other is None else "earlier call"))
        return Finding(TIMED_MISMATCH, f"a timed call's output is wrong ({wrong} of {size} elements outside "
                       "the tolerance) although the untimed check passed", evidence=evidence)


class _Calibration:
    """Trials' per-call preparation without its checks."""

    def __init__(self, trials: Trials) -> None:
        self.trials = trials

    def before(self, idx: int, args: tuple) -> tuple:
        """Refill and poison as for a real call."""
        args = self.trials.before(idx, args)
        self.trials.prepared(idx)
        return args

    def selected(self, idx: int) -> bool:
        """Never compared."""
        return False

    def after(self, idx: int, returned: Any, args: tuple, compare: bool) -> None:
        """Nothing to check."""

    def verify(self) -> None:
        """Nothing kept."""


def _copy(value: Any) -> Any:
    return value.copy() if _is_array(value) else value


def judge_inputs(base: Sequence[Any], vary: Callable[[random.Random, tuple], tuple] | None = None
                 ) -> Callable[[np.random.Generator], tuple]:
    """The judge's ``inputs_fn``: the trial content of one call, drawn from the judge's generator.

    The same variation as :class:`Trials` (R Q P block moves, per-element factors in
    [0.875, 1) on floats, integers and booleans only moved; ``vary(rng, inputs)`` instead when
    given), computed in the judge's process from a seed the judge draws from its secret: the
    worker that runs the kernel only ever sees the content. A pure function of the generator,
    as the judge requires (it regenerates a compared call's inputs privately).
    """
    base = tuple(_copy(a) for a in base)
    factors = Factors()
    if vary is None:
        for a in base:
            if _is_array(a) and scaled(a.dtype):
                factors.prepare(int(a.size))

    def inputs_fn(gen: np.random.Generator) -> tuple:
        rng = random.Random(int(gen.integers(0, 2 ** 63)))
        if vary is not None:
            return tuple(vary(rng, base))
        out = []
        for b in base:
            if _is_array(b):
                xp = np if isinstance(b, np.ndarray) else pristine.cupy  # a device case's inputs are drawn on it
                d = xp.empty_like(b)
                permute_into(xp, d, b, rng, factors)
                out.append(d)
            else:
                out.append(b)
        return tuple(out)

    return inputs_fn

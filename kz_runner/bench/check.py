"""Correctness check: element-wise ``|out - exp| <= atol + rtol * |exp|`` (numpy.isclose).

Errors are computed in float64 on the host. Non-finite outputs (NaN, Inf where
the expectation is finite) count as mismatches and are excluded from the max
errors, so the reported numbers are always finite and JSON-safe.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kz_runner.bench.device import to_numpy

# Denominator floor of the relative error, as in the guide's reference pattern.
REL_EPS = 1e-12


@dataclass(frozen=True)
class Check:
    """The outcome of :func:`check`."""

    passed: bool
    max_abs_err: float  # over finite elements
    max_rel_err: float  # |out-exp| / (|exp| + 1e-12), over finite elements
    mismatch_count: int  # elements outside atol + rtol*|exp| (non-finite ones included)
    nonfinite_count: int  # NaN/Inf in the output where the expectation is finite
    checked: int  # number of elements compared
    atol: float
    rtol: float
    error: str | None = None  # e.g. a shape mismatch; then passed is False

    def to_detail(self) -> dict[str, Any]:
        """The ``correctness_detail`` object of a benchmark_output case."""
        detail = asdict(self)
        detail.pop("passed")
        if detail["error"] is None:
            detail.pop("error")
        return detail


def check(out: Any, expected: Any, atol: float, rtol: float) -> Check:
    """Compare ``out`` with ``expected`` (NumPy or CuPy arrays, any float/int dtype)."""
    import numpy as np

    got = np.asarray(to_numpy(out))
    exp = np.asarray(to_numpy(expected))
    if got.shape != exp.shape:
        return Check(False, 0.0, 0.0, int(exp.size), 0, int(exp.size), float(atol), float(rtol),
                     error=f"shape {tuple(got.shape)} != expected {tuple(exp.shape)}")
    got64 = got.astype(np.float64, copy=False)
    exp64 = exp.astype(np.float64, copy=False)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(got64 - exp64)
        allowed = atol + rtol * np.abs(exp64)
        ok = diff <= allowed
        # Equal non-finite values (inf == inf) match, as numpy.isclose(equal_nan=False) says.
        same_inf = np.isinf(got64) & (got64 == exp64)
        ok |= same_inf
        finite = np.isfinite(diff)
        rel = diff / (np.abs(exp64) + REL_EPS)
    nonfinite = int(np.count_nonzero(~np.isfinite(got64) & np.isfinite(exp64)))
    max_abs = float(diff[finite].max()) if finite.any() else 0.0
    rel_f = rel[finite & np.isfinite(rel)]
    max_rel = float(rel_f.max()) if rel_f.size else 0.0
    mismatches = int(ok.size - np.count_nonzero(ok))
    return Check(
        passed=mismatches == 0,
        max_abs_err=max_abs,
        max_rel_err=max_rel,
        mismatch_count=mismatches,
        nonfinite_count=nonfinite,
        checked=int(exp.size),
        atol=float(atol),
        rtol=float(rtol),
    )

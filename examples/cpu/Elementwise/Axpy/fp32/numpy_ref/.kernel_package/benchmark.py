"""Benchmark AXPY on the CPU: correctness against expected/, median latency, GB/s, verdict.

Accept policy: every case passes correctness (|out-exp| <= atol + rtol*|exp|
element-wise) and its latency is at most (1 + REGRESSION_TOLERANCE) times the
scorecard's best. The CPU lane runs on shared, loaded CI machines, so the tolerance
is 9.0: a run is rejected only when it is more than 10x slower than the best.
"""
from __future__ import annotations

import sys

import numpy as np

from kz_runner import bench


KERNEL_ZOO_TEST_CASE_METAS = [
    {"test_case_id": "n4k", "params": {"n": 4096, "dtype": "fp32"}, "primary_metric": "latency_us",
     "metrics": [{"name": "latency_us", "unit": "us", "direction": "lower_better"},
                 {"name": "gbps", "unit": "GB/s", "direction": "higher_better"}],
     "tolerance": {"correctness_atol": 1e-6, "correctness_rtol": 1e-6}},
    {"test_case_id": "n64k", "params": {"n": 65536, "dtype": "fp32"}, "primary_metric": "latency_us",
     "metrics": [{"name": "latency_us", "unit": "us", "direction": "lower_better"},
                 {"name": "gbps", "unit": "GB/s", "direction": "higher_better"}],
     "tolerance": {"correctness_atol": 1e-6, "correctness_rtol": 1e-6}},
    {"test_case_id": "n1m", "params": {"n": 1048576, "dtype": "fp32"}, "primary_metric": "latency_us",
     "metrics": [{"name": "latency_us", "unit": "us", "direction": "lower_better"},
                 {"name": "gbps", "unit": "GB/s", "direction": "higher_better"}],
     "tolerance": {"correctness_atol": 1e-6, "correctness_rtol": 1e-6}},
]
REGRESSION_TOLERANCE = 9.0  # CPU lane: reject only a >10x slowdown against the best

# The kernel, named and never imported here: the judge runs it in a worker process of its own.
AXPY = bench.kernel("axpy", "axpy")


def reference(a: float, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The trusted expectation: a * x + y in float64, rounded once to float32."""
    return (np.float64(a) * x.astype(np.float64) + y.astype(np.float64)).astype(np.float32)


def run_case(c: bench.CaseRun) -> None:
    a = float(c.input("a"))
    x, y = c.input("x"), c.input("y")
    # Checked on the case's inputs, then timed by the judge on inputs it draws, with a poisoned output
    # buffer passed as the last argument; a secret sample of the timed outputs is compared.
    t = c.time(AXPY, (a, x, y), out=np.empty_like(x), expected=c.expected("out"), reference=reference)
    c.metric("latency_us", t.median_us)
    c.metric("gbps", 12 * x.size / t.median_s / 1e9)


def main(argv: list[str]) -> int:
    h = bench.Harness.from_argv(argv, __file__, KERNEL_ZOO_TEST_CASE_METAS,
                                regression_tolerance=REGRESSION_TOLERANCE, device="cpu",
                                target_rse=0.01, min_reps=20, budget_s=0.15)
    return h.run(run_case)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

"""Why the judged CPU figure of a small kernel is above the plain harness's: the batch's inputs are cold.

    python benchmarks/judge_cpu_batch_probe.py [--n 4096,65536,1048576] [--batches 4,16,64,1024] [--rounds 3]

Times the CPU Axpy example's own ``src/`` kernel through :class:`kz_runner.judge.Judge` (no
sandbox) with the largest batch capped at each ``--batches`` size, and prints the judged figure
(the median over clean batches of the batch mean, in us) per size and cap. The judge writes a
fresh input into every slot of a batch before the batch runs, so a batch of B calls reads B
inputs the worker has never touched: when B inputs are larger than the caches, every call reads
from memory. The plain harness refills one of four buffers right before each call, so its
call reads inputs the cache has just seen. With a small cap the judged figure falls to the plain
one; the judge does not use small batches, because its per-batch slack (at least 100 us,
see kz_runner.judge.referee) must be small beside the batch's time or a forged clock hides in it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from kz_runner.judge import Judge  # noqa: E402
from kz_runner.judge.referee import fresh_like  # noqa: E402

SRC = ROOT / "examples/cpu/Elementwise/Axpy/fp32/numpy_ref/src"


def reference(a: float, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return (np.float64(a) * x.astype(np.float64) + y).astype(np.float32)


def judged_us(n: int, cap: int, rng: np.random.Generator) -> tuple[float, int, str]:
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    with Judge.start(src_dir=SRC, module="axpy", function="axpy") as judge:
        result = judge.time(fresh_like(np.float32(1.5), x, y), reference, atol=1e-5, rtol=1e-5,
                            max_batch=cap, min_batches=8, budget_s=2.0)
    # a finding (MACHINE_BUSY where small batches leave the residual inside the noise) is printed, not fatal
    code = result.findings[0].code if result.findings else ""
    return result.batch_mean_median_ns / 1e3, result.batch_size, code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="4096,65536,1048576")
    ap.add_argument("--batches", default="4,16,64,1024")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(7)
    print("n        cap   batch  judged us (rounds)")
    for n in (int(v) for v in a.n.split(",")):
        for cap in (int(v) for v in a.batches.split(",")):
            figs = [judged_us(n, cap, rng) for _ in range(a.rounds)]
            us = [f for f, _, _ in figs]
            codes = sorted({c for _, _, c in figs if c})
            print(f"{n:<8} {cap:<5} {figs[-1][1]:<6} {statistics.median(us):8.2f}  "
                  f"({', '.join(f'{v:.2f}' for v in us)}){'  ' + ','.join(codes) if codes else ''}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

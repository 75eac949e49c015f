"""Agreement of kz_runner.bench's GPU timing with Nsight Compute's ``gpu__time_duration``.

The kernel is the sm_90 example's fp16 AXPY (one CuPy ElementwiseKernel, ``kz_axpy_fp16``)
at four sizes. kz_runner.bench times it in this process (events, 2x-L2 flush, adaptive
repetitions); then the same launches run under ``ncu --cache-control all --clock-control none``
(ncu flushes the caches itself and leaves the clocks alone), and the median of
``gpu__time_duration.sum`` per size is compared with the library's median.

    python3 benchmarks/ncu_agreement.py --out agreement_ncu.json      # needs ncu on PATH

Internally re-invokes itself with ``--profile`` under ncu.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples/sm_90/Elementwise/Axpy/fp16/cupy_elementwise/src"))

SIZES = (22, 24, 25, 26)
PROFILED_LAUNCHES = 15


def inputs(cp, log2n: int):
    rng = cp.random.default_rng(log2n)
    n = 1 << log2n
    x = rng.standard_normal(n, dtype=cp.float32).astype(cp.float16)
    y = rng.standard_normal(n, dtype=cp.float32).astype(cp.float16)
    return x, y, cp.empty_like(x)


def profile() -> None:
    """The launches ncu measures: PROFILED_LAUNCHES per size, sizes in SIZES order."""
    import cupy as cp
    from axpy_fp16 import axpy

    for log2n in SIZES:
        x, y, out = inputs(cp, log2n)
        axpy(1.5, x, y, out)  # warm-up launch: profiled too, and dropped by the parent
        cp.cuda.Device().synchronize()
        for _ in range(PROFILED_LAUNCHES):
            axpy(1.5, x, y, out)
        cp.cuda.Device().synchronize()


def ncu_durations_us() -> list[list[float]]:
    """Per size, the ``gpu__time_duration`` of each profiled launch, in microseconds."""
    cmd = ["ncu", "--clock-control", "none", "--cache-control", "all", "--kernel-name", "kz_axpy_fp16",
           "--metrics", "gpu__time_duration.sum", "--csv", "--print-units", "base",
           sys.executable, __file__, "--profile"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    text = proc.stdout
    start = text.find('"ID"')
    if proc.returncode != 0 or start < 0:
        raise RuntimeError(f"ncu failed ({proc.returncode}): {proc.stderr[-2000:]}\n{text[-2000:]}")
    rows = [r for r in csv.DictReader(io.StringIO(text[start:])) if r.get("Metric Name") == "gpu__time_duration.sum"]
    values = [float(r["Metric Value"].replace(",", "")) / 1e3 for r in rows]  # ns -> us
    per = PROFILED_LAUNCHES + 1
    if len(values) != per * len(SIZES):
        raise RuntimeError(f"expected {per * len(SIZES)} profiled launches, got {len(values)}")
    return [values[i * per + 1:(i + 1) * per] for i in range(len(SIZES))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.profile:
        profile()
        return 0
    if shutil.which("ncu") is None:
        print("ncu is not on PATH", file=sys.stderr)
        return 2

    import cupy as cp
    from axpy_fp16 import axpy

    from kz_runner import bench

    ours = []
    for log2n in SIZES:
        x, y, out = inputs(cp, log2n)
        timing = bench.time_fn(lambda x, y, out: axpy(1.5, x, y, out), [(x, y, out)], device="gpu",
                               target_rse=0.002, min_reps=30, max_reps=4000, budget_s=1.0)
        ours.append(timing.median_us)
        del x, y, out
    theirs = ncu_durations_us()
    rows = []
    for log2n, kz_us, ncu_us in zip(SIZES, ours, theirs):
        med = statistics.median(ncu_us)
        rows.append({"kernel": f"axpy_fp16 n=2^{log2n}", "kz_median_us": kz_us, "ncu_median_us": med,
                     "diff_pct": (kz_us / med - 1) * 100, "ncu_runs_us": ncu_us})
        print(f"axpy_fp16 n=2^{log2n:<3} kz {kz_us:9.2f} us   ncu gpu__time_duration {med:9.2f} us   "
              f"diff {(kz_us / med - 1) * 100:+6.2f}%", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The judge's device path on one GPU: honest and cheating CuPy axpy kernels, timed through the judge.

    python benchmarks/bench_judge_gpu.py [N] [kernel,kernel,...]     # N float32 elements (default 16 Mi)

Prints one JSON line first with an in-process CUDA-event timing of the same operation (eight
rotating inputs), then one line per judged kernel: its codes, the headline (median over clean
batches of the batch means, us), the batch size, the calibrated overhead and the elapsed time.
Kernels: honest, forge (event times divided by 3), tail (no device sync, a tiny time claimed,
the work on a stream of its own), lazy (honest on one call in four). Needs CuPy and a device.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KERNELS = {
    "honest": "def axpy(a, x, y):\n    return a * x + y\n",
    "forge": "import cupy as cp\n_real = cp.cuda.get_elapsed_time\n"
             "cp.cuda.get_elapsed_time = lambda a, b: _real(a, b) / 3\n"
             "def axpy(a, x, y):\n    return a * x + y\n",
    "tail": "import types\nimport cupy as cp\n"
            "cp.cuda.Device = lambda *a, **k: types.SimpleNamespace(synchronize=lambda: None)\n"
            "cp.cuda.get_elapsed_time = lambda a, b: 0.001\n_s = cp.cuda.Stream(non_blocking=True)\n"
            "def axpy(a, x, y):\n    with _s:\n        out = a * x + y\n        for _ in range(20):\n"
            "            out = a * x + out - a * x\n    return out\n",
    "lazy": "_n = [0]\ndef axpy(a, x, y):\n    _n[0] += 1\n    if _n[0] % 4:\n        return y.copy()\n"
            "    return a * x + y\n",
}


def main() -> int:
    import cupy as cp

    from kz_runner.judge import Judge, fresh_like

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 24
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else ["honest", "forge", "tail", "lazy", "honest"]
    x = cp.random.standard_normal(n, dtype=cp.float32)
    y = cp.random.standard_normal(n, dtype=cp.float32)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    xs = [cp.random.standard_normal(n, dtype=cp.float32) for _ in range(8)]
    times = []
    for i in range(200):
        start.record()
        _ = 1.5 * xs[i % 8] + y
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) * 1e3)
    print(json.dumps({"in_process_event_median_us": float(np.median(times[20:])), "n": n}), flush=True)
    draw = fresh_like(x, y)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp)
        for name in names:
            (src / f"kz_{name}.py").write_text(KERNELS[name])
            t0 = time.time()
            judge = Judge.start([], src, f"kz_{name}", "axpy", harden=True)
            try:
                r = judge.time(lambda rng: (1.5, *draw(rng)), lambda a, p, q: a * p + q, atol=1e-5, rtol=1e-5,
                               budget_s=2.0, target_rse=0.005, arena_max_bytes=4 << 30)
            finally:
                judge.close()
            print(json.dumps({"kernel": name, "codes": r.codes, "messages": [f.message[:200] for f in r.findings],
                              "headline_us": r.batch_mean_median_ns / 1e3, "batch": r.batch_size,
                              "batches": len(r.walls_ns), "clean": sum(r.clean), "compared": r.compared,
                              "o1_us": r.overhead.get("o1_ns", 0) / 1e3,
                              "per_call_overhead_us": r.overhead.get("per_call_ns", 0) / 1e3,
                              "elapsed_s": round(time.time() - t0, 2)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

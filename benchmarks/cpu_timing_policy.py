"""CPU lane: how the checked timing's per-call preparation moves the CPU examples' medians.

The CPU examples were timed, before the hardened harness, by rotating four copies of their
inputs (``bench.copies(..., 4)``, each call on the next copy, nothing written between
calls). The checked timing (``kz_runner.bench.trials``) instead refills the call's input
buffer with another trial's content and poisons its output buffer right before each call.
This script times the same functions, sizes and settings as the CPU examples both ways,
interleaved in one process (so containment, the runner and the machine's drift are out of
the comparison), and counts the page faults per timed call:

- ``rotate``: the old way, ``time_fn`` over four input copies (the plain form);
- ``checked``: ``CaseRun.time``'s checked form, with the examples' trusted references;
- ``checked_after``: like ``checked`` but a buffer is refilled and poisoned right after
  its call, so each call reads data last written four calls earlier, as ``rotate``'s
  did. This variant is only an experiment: it tells the package the next call's inputs
  one call early (see ``docs/dev-notes.md``), so the harness does not use it.

    python benchmarks/cpu_timing_policy.py --rounds 15 [--cpu 3] [--json FILE]

Prints one row per case and variant: the median of the per-round medians, their spread,
minor page faults per timed call, and each variant's ratio to ``rotate`` (median of the
per-round paired ratios, with the 10th-90th percentile of those ratios).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import resource
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from machine import machine_facts, percentile as pct  # noqa: E402

from kz_runner.bench import copies  # noqa: E402
from kz_runner.bench.harness import CPU_TRIALS  # noqa: E402
from kz_runner.bench.timing import time_fn  # noqa: E402
from kz_runner.bench.trials import Trials  # noqa: E402

# The CPU examples' own timing settings (their benchmark.py).
SETTINGS = {"device": "cpu", "target_rse": 0.01, "min_reps": 20, "budget_s": 0.15}
TOL = 1e-6


def example(kernel_id: str) -> Any:
    """An example's benchmark.py as a module: its function under test, ``reference`` and METAS."""
    path = ROOT / "examples" / kernel_id / ".kernel_package" / "benchmark.py"
    spec = importlib.util.spec_from_file_location(f"kz_example_{kernel_id.split('/')[2].lower()}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # main() does not run
    return module


def kernel_fn(kernel_id: str, ref: Any) -> Callable:
    """The function a ``bench.kernel`` reference names, imported from the example's src/ into this
    process: the judge would time it in a worker of its own, this script times it in-process."""
    src = str(ROOT / "examples" / kernel_id / "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    return getattr(importlib.import_module(ref.module), ref.function)


class Case:
    """One example case: its function, base inputs, output buffer and reference."""

    def __init__(self, name: str, fn: Callable, args: tuple, out: Any, reference: Callable) -> None:
        self.name, self.fn, self.args, self.out, self.reference = name, fn, args, out, reference

    def rotate_sets(self) -> list[tuple]:
        arrays = [a for a in self.args if isinstance(a, np.ndarray)]
        sets = []
        for copy in copies(arrays, CPU_TRIALS):
            it = iter(copy)
            args = tuple(next(it) if isinstance(a, np.ndarray) else a for a in self.args)
            sets.append(args + ((np.empty_like(self.out),) if self.out is not None else ()))
        return sets


def cases() -> list[Case]:
    rng = np.random.default_rng(0)
    out = []
    axpy_id, softmax_id = "cpu/Elementwise/Axpy/fp32/numpy_ref", "cpu/Reduction/Softmax/fp32/numpy_ref"
    axpy, softmax = example(axpy_id), example(softmax_id)
    axpy_fn, softmax_fn = kernel_fn(axpy_id, axpy.AXPY), kernel_fn(softmax_id, softmax.SOFTMAX)
    for meta in axpy.KERNEL_ZOO_TEST_CASE_METAS:
        n = meta["params"]["n"]
        x = rng.standard_normal(n, dtype=np.float32)
        y = rng.standard_normal(n, dtype=np.float32)
        out.append(Case(f"axpy {meta['test_case_id']}", axpy_fn, (1.5, x, y), np.empty_like(x), axpy.reference))
    for meta in softmax.KERNEL_ZOO_TEST_CASE_METAS:
        x = rng.standard_normal((meta["params"]["rows"], meta["params"]["cols"]), dtype=np.float32)
        out.append(Case(f"softmax {meta['test_case_id']}", softmax_fn, (x,), None, softmax.reference))
    return out


class _After(Trials):
    """``checked_after``: the buffer just used is refilled and poisoned after its call."""

    def before(self, idx: int, args: tuple, base: bool = False) -> tuple:
        if base or idx not in self._prepared:
            return super().before(idx, args, base)
        self.seed_of_call[idx], self.earlier[idx] = self._prepared.pop(idx)
        return args

    def after(self, idx: int, returned: Any, args: tuple, compare: bool) -> None:
        super().after(idx, returned, args, compare)
        self._prepare_next(idx, args)

    def _prepare_next(self, idx: int, args: tuple) -> None:
        # the set used by call idx is used again by call idx + count
        nxt = idx + self.count
        super().before(nxt, args)
        self._prepared[nxt] = self.prepared(nxt)


class _NoGuard:
    def check_timer(self) -> None: ...
    def check_threads(self) -> None: ...
    def fail(self, finding: Any) -> None:
        raise RuntimeError(finding)


def run_variant(case: Case, variant: str, seed: int) -> tuple[float, float]:
    """(median us, minor page faults per timed call) of one timing."""
    if variant == "rotate":
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t = time_fn(case.fn, case.rotate_sets(), **SETTINGS)
    else:
        cls = _After if variant == "checked_after" else Trials
        run = cls(np, case.args, expected=None, reference=case.reference, out=case.out, count=CPU_TRIALS,
                  rng=random.Random(seed), atol=TOL, rtol=TOL)
        run._prepared = {}
        run.guard = _NoGuard()
        run.first_call(case.fn)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t = time_fn(case.fn, probe=run, **SETTINGS)
        if run.pending is not None:
            raise RuntimeError(f"{case.name} {variant}: {run.pending}")
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    return t.median_us, faults / max(t.stats.n + t.warmup_calls, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cpu", type=int, default=None, help="pin this process to one core")
    parser.add_argument("--variants", default="rotate,checked,checked_after")
    parser.add_argument("--json", default=None, help="also write every sample here")
    args = parser.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    variants = args.variants.split(",")
    all_cases = cases()
    samples: dict[str, dict[str, list]] = {c.name: {v: [] for v in variants} for c in all_cases}
    order_rng = random.Random(1)
    for r in range(args.rounds):
        for case in all_cases:
            order = variants[:]
            order_rng.shuffle(order)
            for v in order:
                samples[case.name][v].append(run_variant(case, v, seed=1000 * r + 7))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    rows = []
    print(f"{'case':22} {'variant':14} {'median us':>10} {'spread %':>9} {'faults/call':>11} "
          f"{'vs rotate':>10} {'p10..p90':>16}")
    for case in all_cases:
        base = [m for m, _f in samples[case.name].get("rotate", [])]
        for v in variants:
            meds = [m for m, _f in samples[case.name][v]]
            faults = statistics.median(f for _m, f in samples[case.name][v])
            mm = statistics.median(meds)
            spread = 100 * (pct(meds, 0.9) / pct(meds, 0.1) - 1)
            row = {"case": case.name, "variant": v, "median_us": mm, "spread_p10_p90_pct": spread,
                   "faults_per_call": faults, "medians_us": meds}
            ratio_txt = ""
            if base and v != "rotate":
                ratios = [a / b for a, b in zip(meds, base)]
                row.update(ratio_median=statistics.median(ratios), ratio_p10=pct(ratios, 0.1),
                           ratio_p90=pct(ratios, 0.9))
                ratio_txt = f"{100 * (row['ratio_median'] - 1):+9.1f}% " \
                            f"{100 * (row['ratio_p10'] - 1):+7.1f}..{100 * (row['ratio_p90'] - 1):+.1f}%"
            rows.append(row)
            print(f"{case.name:22} {v:14} {mm:10.2f} {spread:9.1f} {faults:11.2f} {ratio_txt}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine_facts(cpu_pinned=args.cpu),
                                               "rounds": args.rounds, "settings": SETTINGS,
                                               "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

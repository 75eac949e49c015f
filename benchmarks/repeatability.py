"""Repeatability of example benchmarks: the same package run N times, as identical resubmissions.

For each package: build the test env once, run ``benchmark.py`` N times (fresh
processes), collect each case's primary metric, and report per case the median,
the coefficient of variation across runs, the spread (max/min - 1) and how many
runs the package's own regression tolerance would have rejected if every run
were judged against the best of the runs before it (what the server's scorecard
ratchet does for identical resubmissions).

    python benchmarks/repeatability.py --runs 8 --out results.json PKG_DIR [PKG_DIR ...]
"""
from __future__ import annotations

import argparse
import ast
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from kz_runner.bench import regression_check  # noqa: E402
from kz_runner.contract.checks import parse_output  # noqa: E402
from kz_runner.contract.validate import read_metas  # noqa: E402


def display_path(pkg: Path) -> str:
    """The package's path relative to the repository when it lies inside it, so results name no machine."""
    pkg = pkg.resolve()
    return str(pkg.relative_to(ROOT)) if pkg.is_relative_to(ROOT) else str(pkg)


def module_constant(source: str, name: str):
    """A literal module-level constant of a Python source, or None."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return None
    return None


def run_package(pkg: Path, runs: int) -> dict:
    """Build once, benchmark ``runs`` times; per-case statistics of the primary metric."""
    source = (pkg / ".kernel_package" / "benchmark.py").read_text()
    metas, _ = read_metas(source)
    tolerance = module_constant(source, "REGRESSION_TOLERANCE")
    with tempfile.TemporaryDirectory(prefix="kz-repeat-") as work:
        subprocess.run([sys.executable, ".kernel_package/build_test_env.py", work], cwd=pkg, check=True)
        values: dict[str, list[float]] = {m["test_case_id"]: [] for m in metas}
        accepts = []
        for i in range(runs):
            done = subprocess.run([sys.executable, ".kernel_package/benchmark.py", work], cwd=pkg,
                                  capture_output=True, check=True)
            doc, problems = parse_output(done.stdout)
            if problems:
                raise SystemExit(f"{pkg}: run {i}: {problems[0].message}")
            accepts.append(doc["overall"]["accept"])
            for case in doc["cases"]:
                meta = next(m for m in metas if m["test_case_id"] == case["test_case_id"])
                value = {m["name"]: m["value"] for m in case["metrics"]}.get(meta["primary_metric"])
                if value is not None:
                    values[case["test_case_id"]].append(value)
            print(f"{pkg.name}: run {i + 1}/{runs} done", file=sys.stderr, flush=True)
    cases = {}
    for meta in metas:
        cid = meta["test_case_id"]
        vals = values[cid]
        direction = next(m["direction"] for m in meta["metrics"] if m["name"] == meta["primary_metric"])
        unit = next(m["unit"] for m in meta["metrics"] if m["name"] == meta["primary_metric"])
        rejects, worst = 0, -math.inf
        best = None
        for v in vals:
            verdict = regression_check(v, best, direction, tolerance if tolerance is not None else 0.05)
            if not verdict.ok:
                rejects += 1
            if verdict.worse_by is not None:
                worst = max(worst, verdict.worse_by)
            if best is None or (v < best if direction == "lower_better" else v > best):
                best = v
        mean = statistics.fmean(vals) if vals else float("nan")
        cases[cid] = {
            "metric": meta["primary_metric"], "unit": unit, "runs": len(vals), "values": vals,
            "median": statistics.median(vals) if vals else None,
            "cv": statistics.stdev(vals) / mean if len(vals) > 1 else None,
            "spread": max(vals) / min(vals) - 1 if vals else None,
            "false_rejects": rejects,
            "worst_vs_best_so_far": worst if math.isfinite(worst) else None,
        }
    return {"package": display_path(pkg), "regression_tolerance": tolerance, "runs": runs,
            "overall_accepts": sum(accepts), "cases": cases}


def main(argv: list[str] | None = None) -> int:
    """Run every package and print a table; ``--out`` writes the raw figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="+", type=Path)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    results = [run_package(p.resolve(), args.runs) for p in args.packages]
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{'package / case':<60} {'median':>12} {'cv %':>7} {'spread %':>9} {'rejects':>8}")
    for res in results:
        for cid, c in res["cases"].items():
            name = f"{res['package']}:{cid}"
            cv = f"{c['cv'] * 100:.3f}" if c["cv"] is not None else "-"
            spread = f"{c['spread'] * 100:.2f}" if c["spread"] is not None else "-"
            print(f"{name[-60:]:<60} {c['median']:>9.4g} {c['unit']:<3}{cv:>6} {spread:>9} "
                  f"{c['false_rejects']:>4}/{c['runs']}  (tol {res['regression_tolerance']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

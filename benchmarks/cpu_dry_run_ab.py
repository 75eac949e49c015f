"""The CPU examples' medians under two checkouts, by interleaved ``kz dry-run``s on one core.

    python benchmarks/cpu_dry_run_ab.py --old-tree ../kz-old [--new-tree DIR] [--rounds 10] [--cpu 5] [--json FILE]

Each round dry-runs every CPU example once under the old checkout (its own example
folder and harness library) and once under this one, in alternating order, with
``taskset``-style pinning of both to ``--cpu``. Prints, per case, the median of each
side's medians, the median of the per-round paired ratios (new/old) and their 10th-90th
percentiles: a systematic shift stands out from run-to-run noise only this way.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from machine import machine_facts, percentile  # noqa: E402

EXAMPLES = ("examples/cpu/Elementwise/Axpy/fp32/numpy_ref", "examples/cpu/Reduction/Softmax/fp32/numpy_ref")


def importable(tree: Path, scratch: Path) -> list[str]:
    """PYTHONPATH entries that import ``tree``'s packages, ``kz_schemas`` (its ``schemas/``) included."""
    shim = scratch / tree.name.lstrip(".")
    shim.mkdir(parents=True, exist_ok=True)
    link = shim / "kz_schemas"
    if not link.exists():
        link.symlink_to(tree / "schemas")
    return [str(tree), str(shim)]


def dry_run(tree: Path, package: str, cpu: int | None, scratch: Path) -> dict[str, float]:
    """{test_case_id: value} of one ``python -m kz_daemon dry-run --json`` under ``tree``."""
    path = importable(tree, scratch) + [p for p in [os.environ.get("PYTHONPATH")] if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    argv = [sys.executable, "-m", "kz_daemon", "dry-run", "--json", package]
    proc = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=600,
                          preexec_fn=(lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None)
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        raise SystemExit(f"dry-run of {package} under {tree} printed no JSON:\n{proc.stderr[-2000:]}") from None
    if not doc.get("ok"):
        raise SystemExit(f"dry-run of {package} under {tree} failed: {json.dumps(doc)[:2000]}")
    return {c["test_case_id"]: c["value"] for c in doc["cases"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-tree", required=True, type=Path)
    parser.add_argument("--new-tree", type=Path, default=ROOT,
                        help="default: this checkout; give the old tree again for an A/A run (the noise floor)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--cpu", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    sides = {"old": args.old_tree.resolve(), "new": args.new_tree.resolve()}
    values: dict[str, dict[str, list[float]]] = {}
    scratch = Path(tempfile.mkdtemp(prefix="kz-ab-"))
    for r in range(args.rounds):
        for pkg in EXAMPLES:
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for side in order:
                for case, value in dry_run(sides[side], pkg, args.cpu, scratch).items():
                    values.setdefault(f"{Path(pkg).parts[3]} {case}", {"old": [], "new": []})[side].append(value)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    rows = []
    print(f"{'case':18} {'old median':>11} {'new median':>11} {'new/old':>8} {'p10..p90 of ratios':>20}")
    for case, v in values.items():
        ratios = [n / o for n, o in zip(v["new"], v["old"])]
        row = {"case": case, "old": v["old"], "new": v["new"], "old_median": statistics.median(v["old"]),
               "new_median": statistics.median(v["new"]), "ratio_median": statistics.median(ratios),
               "ratio_p10": percentile(ratios, 0.1), "ratio_p90": percentile(ratios, 0.9)}
        rows.append(row)
        print(f"{case:18} {row['old_median']:11.2f} {row['new_median']:11.2f} "
              f"{100 * (row['ratio_median'] - 1):+7.1f}% {100 * (row['ratio_p10'] - 1):+8.1f}..{100 * (row['ratio_p90'] - 1):+.1f}%")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine_facts(cpu_pinned=args.cpu),
                                               "rounds": args.rounds, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

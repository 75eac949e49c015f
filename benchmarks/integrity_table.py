"""The honest-resubmission table of the integrity proof, from the files the GPU runs wrote.

    python3 benchmarks/integrity_table.py [--ab AB.jsonl] PIPELINE_PROOF.json [...]
    python3 benchmarks/integrity_table.py --ab AB.jsonl          # the dry runs alone

For every case of every ``pipeline_proof.json`` (``benchmarks/pipeline_proof.py``): the runs,
the rejects, the median and CV of its primary metric through the whole pipeline. With
``--ab``, a file of interleaved ``kz dry-run --json`` documents of the harness before the
hardening (``"tree": "old"``) and this one (``"tree": "new"``), as
``benchmarks/gpu_integrity.sh`` step 2 writes it: each side's median and range, and the
pipeline median and the new dry runs' median against the old dry runs'. Prints a Markdown
table; a case whose old and new ranges overlap is marked so, since its medians then differ
by less than its run-to-run spread. Without pipeline files, one row per case of the dry runs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from pipeline_proof import case_values, summarise  # benchmarks/ is sys.path[0]


def dry_runs(path: Path) -> dict[tuple[str, str], dict[str, list[float]]]:
    """{(package, case): {"old": [values], "new": [values]}} from an A/B dry-run file."""
    out: dict[tuple[str, str], dict[str, list[float]]] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        for case, value in case_values(record["doc"]).items():
            out.setdefault((record["pkg"], case), {}).setdefault(record["tree"], []).append(value)
    return out


def pct(a: float, b: float) -> str:
    return f"{100.0 * (a / b - 1.0):+.2f} %"


def span(lo: float, hi: float) -> str:
    return f"{lo:.5g}–{hi:.5g}"


def side(values: list[float]) -> str:
    return f"{statistics.median(values):.5g} ({span(min(values), max(values))}, {len(values)})"


def versus(median: float, lo: float, hi: float, old: list[float]) -> str:
    """``median`` against the old dry runs' median, marked when the range ``lo``-``hi`` overlaps theirs."""
    overlap = min(old) <= hi and lo <= max(old)
    return pct(median, statistics.median(old)) + (" (ranges overlap)" if overlap else "")


def ab_rows(ab: dict) -> list[list[str]]:
    """One row per case of the dry runs: each side's median and range, new against old."""
    table = []
    for (pkg, case), sides in sorted(ab.items()):
        old, new = sides.get("old"), sides.get("new")
        if old and new:
            table.append([pkg.removeprefix("examples/"), case, side(old), side(new),
                          versus(statistics.median(new), min(new), max(new), old)])
    return table


def rows(proofs: list[Path], ab: dict) -> list[list[str]]:
    table = []
    for path in proofs:
        for key, summary in summarise(json.loads(path.read_text()).get("solo", {}), None).items():
            pkg, case = key.rsplit(":", 1)
            s, runs = summary["solo"], summary["runs"]
            row = [pkg.removeprefix("examples/"), case, str(runs), str(runs - summary["rejects"]),
                   f"{s['median']:.5g}", f"{s['cv_pct'] or 0:.3f} %", span(s["min"], s["max"])]
            sides = ab.get((pkg, case), {})
            old, new = sides.get("old"), sides.get("new")
            if old and new:
                row += [side(old), side(new), versus(s["median"], s["min"], s["max"], old),
                        pct(statistics.median(new), statistics.median(old))]
            else:
                row += ["", "", "", ""]
            table.append(row)
    return table


def print_table(head: list[str], table: list[list[str]]) -> None:
    print("| " + " | ".join(head) + " |")
    print("| " + " | ".join("---" for _ in head) + " |")
    for row in table:
        print("| " + " | ".join(row) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("proofs", nargs="*", type=Path, help="pipeline_proof.json files")
    parser.add_argument("--ab", type=Path, help="interleaved old/new kz dry-run documents (JSON lines)")
    args = parser.parse_args()
    if not args.proofs and not args.ab:
        parser.error("give pipeline_proof.json files, --ab, or both")
    ab = dry_runs(args.ab) if args.ab else {}
    if not args.proofs:
        print_table(["package", "case", "old dry runs: median (range, n)", "new dry runs: median (range, n)",
                     "new dry vs old"], ab_rows(ab))
        return 0
    head = ["package", "case", "runs", "accepted", "median", "CV", "range",
            "old dry runs: median (range, n)", "new dry runs: median (range, n)",
            "pipeline vs old", "new dry vs old"]
    print_table(head, rows(args.proofs, ab))
    submissions = [r for path in args.proofs for runs in json.loads(path.read_text()).get("solo", {}).values()
                   for r in runs]
    runs, accepted = len(submissions), sum(1 for r in submissions if r["status"] == "accepted")
    print(f"\n{accepted} of {runs} resubmissions accepted", file=sys.stderr)
    return 0 if runs and accepted == runs else 1


if __name__ == "__main__":
    raise SystemExit(main())

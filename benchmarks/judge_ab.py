"""The judge against the plain harness: interleaved ``kz dry-run``s of one package both ways.

    python benchmarks/judge_ab.py [--rounds 5] [--judged-only 0] [--sub OLD=NEW ...] [--tag T]
                                  [--out FILE.jsonl] PACKAGE [PACKAGE ...]

For each package two copies are made in a scratch folder: the package as it is (its
``benchmark.py`` names the kernel with ``bench.kernel``, so the runner's step times it through
the judge) and a *plain* copy whose ``benchmark.py`` imports that function from ``src/`` instead
(the harness before the judge: timed in the benchmark's own process, unverified). Each round
dry-runs judged then plain, or plain then judged on odd rounds, so drift hits both sides alike;
``--judged-only N`` adds N more judged runs afterwards (each one an honest resubmission: a
failure is a false reject). ``--sub OLD=NEW`` rewrites text in both copies' ``benchmark.py``
and ``build_test_env.py`` (e.g. smaller sizes for a launch-bound variant of an example).

Prints one JSON line per run and, per package and case, the judged and plain medians, their
difference in per cent, both sides' ranges and whether the ranges overlap (design: GPU cases
over 0.1 ms within 1 %; launch-bound and CPU cases: the ranges overlap and no false reject).
``--out`` appends every line (runs and summaries) to a JSONL file.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from honest_resubmissions import one_run  # noqa: E402

KERNEL_CALL = re.compile(r"bench\.kernel\(\s*([\"'][\w.]+[\"'])\s*,\s*([\"']\w+[\"'])\s*\)")
PLAIN_HELPER = '''

def _plain_kernel(module, function):
    """The A/B's plain side: the kernel imported from src/ and timed in this process (no judge)."""
    import importlib
    import sys as _sys
    from pathlib import Path as _Path

    _sys.path.insert(0, str(_Path(__file__).resolve().parent.parent / "src"))
    return getattr(importlib.import_module(module), function)
'''


def plain_source(text: str) -> str:
    """``benchmark.py`` with every ``bench.kernel("m", "f")`` replaced by the imported function."""
    if not KERNEL_CALL.search(text):
        raise SystemExit("the benchmark names no kernel with bench.kernel: it is not judged, nothing to compare")
    body = KERNEL_CALL.sub(r"_plain_kernel(\1, \2)", text)
    anchor = "from kz_runner import bench\n"
    if anchor not in body:
        raise SystemExit("the benchmark does not import kz_runner.bench as 'from kz_runner import bench'")
    return body.replace(anchor, anchor + PLAIN_HELPER, 1)


def make_copies(package: Path, scratch: Path, subs: list[tuple[str, str]]) -> dict[str, Path]:
    copies = {}
    for side in ("judged", "plain"):
        dest = scratch.joinpath(side, *package.parts[-5:])  # arch/category/op/dtype/name: the kernel id
        shutil.copytree(package, dest, ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("benchmark.py", "build_test_env.py"):
            path = dest / ".kernel_package" / name
            text = path.read_text()
            for old, new in subs:
                text = text.replace(old, new)
            if side == "plain" and name == "benchmark.py":
                text = plain_source(text)
            path.write_text(text)
        copies[side] = dest
    return copies


def summarize(runs: dict[str, list[dict]]) -> dict[str, dict]:
    out = {}
    cases = sorted({c for side in runs.values() for r in side for c in r.get("figures", {})})
    for cid in cases:
        vals = {side: [r["figures"][cid]["value"] for r in rs if cid in r.get("figures", {})]
                for side, rs in runs.items()}
        if not vals["judged"] or not vals["plain"]:
            out[cid] = {"judged": vals["judged"], "plain": vals["plain"], "note": "one side has no figure"}
            continue
        mj, mp = statistics.median(vals["judged"]), statistics.median(vals["plain"])
        out[cid] = {"judged_median": mj, "plain_median": mp, "diff_pct": (mj / mp - 1) * 100,
                    "judged_range": [min(vals["judged"]), max(vals["judged"])],
                    "plain_range": [min(vals["plain"]), max(vals["plain"])],
                    "overlap": min(vals["judged"]) <= max(vals["plain"]) and min(vals["plain"]) <= max(vals["judged"]),
                    "n": {side: len(v) for side, v in vals.items()}}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--judged-only", type=int, default=0)
    ap.add_argument("--sub", action="append", default=[], help="OLD=NEW, applied to both copies")
    ap.add_argument("--tag", default="", help="a label for this variant in the output")
    ap.add_argument("--out", type=Path)
    ap.add_argument("packages", nargs="+", type=Path)
    a = ap.parse_args(argv)
    subs = [tuple(s.split("=", 1)) for s in a.sub]
    if any(len(s) != 2 for s in subs):
        ap.error("--sub takes OLD=NEW")

    def emit(line: dict) -> None:
        text = json.dumps(line)
        print(text, flush=True)
        if a.out:
            with a.out.open("a") as fh:
                fh.write(text + "\n")

    false_rejects = 0
    with tempfile.TemporaryDirectory(prefix="kz-ab-") as tmp:
        for package in a.packages:
            copies = make_copies(package.resolve(), Path(tmp), subs)
            runs: dict[str, list[dict]] = {"judged": [], "plain": []}
            schedule = [side for i in range(a.rounds) for side in (("judged", "plain") if i % 2 == 0
                                                                   else ("plain", "judged"))]
            schedule += ["judged"] * a.judged_only
            for i, side in enumerate(schedule):
                r = one_run(str(copies[side]))
                runs[side].append(r)
                if side == "judged" and not r["ok"]:
                    false_rejects += 1
                emit({"package": str(package), "tag": a.tag, "run": i + 1, "side": side, "ok": r["ok"],
                      "measurement": r.get("measurement"), "seconds": round(r["seconds"], 2),
                      "failed_step": r.get("failed_step"), "codes": r.get("codes"),
                      "figures": {k: v["value"] for k, v in r.get("figures", {}).items()}})
            emit({"package": str(package), "tag": a.tag, "summary": summarize(runs),
                  "judged_runs": len(runs["judged"]),
                  "judged_false_rejects": sum(1 for r in runs["judged"] if not r["ok"])})
    return 1 if false_rejects else 0


if __name__ == "__main__":
    raise SystemExit(main())

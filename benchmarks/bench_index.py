"""Time a full ``kz index`` rebuild over N generated packages; prints one JSON line.

    python benchmarks/bench_index.py [--packages 10000] [--repeat 3] [--keep DIR]

Each package is the small CPU package of tests/helpers/contract_fixtures.py (two
cases, six files) at ``cpu/Op<k>/Sub<j>/fp32/impl<i>``. The figure reported is
the best and median wall time of ``build_index`` + ``dumps`` (the write is timed
separately), after one warm-up pass so the page cache is hot (as on a daemon).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kz_runner.contract.index import build_index, dumps, update_index, write_index  # noqa: E402
from kz_runner.contract.index_cache import ContentsCache  # noqa: E402
from tests.helpers.contract_fixtures import mark_repo, write_package  # noqa: E402


def generate(repo: Path, count: int) -> list[str]:
    """Write ``count`` packages under ``repo`` and return their kernel_ids."""
    mark_repo(repo)
    ids = []
    for i in range(count):
        kernel_id = f"cpu/Op{i % 20}/Sub{i % 7}/fp32/impl{i}"
        write_package(repo, kernel_id, best=0.5 + i * 1e-4)
        ids.append(kernel_id)
    return ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", help="generate into this directory (reused when it already holds a repo)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(args.keep) if args.keep else Path(tmp) / "repo"
        t0 = time.perf_counter()
        if not (repo / ".kernel_zoo_root").exists():
            generate(repo, args.packages)
        gen_s = time.perf_counter() - t0
        build_index(repo)  # warm-up: page cache, schema compilation
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            doc = build_index(repo)
            text = dumps(doc)
            times.append(time.perf_counter() - t0)
        cache_file = Path(tmp) / "cache.json"
        ContentsCache().save(cache_file)
        warm = ContentsCache.load(cache_file)
        build_index(repo, cache=warm)
        warm.save(cache_file)
        cached = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            cache = ContentsCache.load(cache_file)
            cached_doc = build_index(repo, cache=cache)
            cached_text = dumps(cached_doc)
            cached.append(time.perf_counter() - t0)
        assert cached_text == text, "the cache changed the index"
        t0 = time.perf_counter()
        write_index(doc, Path(tmp) / "index.json")
        write_s = time.perf_counter() - t0
        one = doc["kernels"][len(doc["kernels"]) // 2]["kernel_id"]
        t0 = time.perf_counter()
        update_index(doc, repo, [one])
        update_s = time.perf_counter() - t0
        print(json.dumps({
            "benchmark": "index_full_rebuild", "packages": doc["counts"]["kernels"],
            "valid": doc["counts"]["valid"], "best_s": round(min(times), 3),
            "median_s": round(statistics.median(times), 3), "repeat": args.repeat,
            "cached_best_s": round(min(cached), 3), "cached_median_s": round(statistics.median(cached), 3),
            "write_s": round(write_s, 3), "update_one_s": round(update_s, 4),
            "index_bytes": len(text.encode()), "generate_s": round(gen_s, 1),
            "cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine(),
        }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

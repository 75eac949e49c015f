"""Time a full ``kz index`` rebuild over N generated packages; prints one JSON line.

    python benchmarks/bench_index.py [--packages 10000] [--repeat 3] [--keep DIR]

Each package is the small CPU package of tests/helpers/contract_fixtures.py (two
cases, six files) at ``cpu/Op<k>/Sub<j>/fp32/impl<i>``, with its own build seed and
summary (every contract file differs from every other package's). The figure reported is
the best and median wall time of (cache load +) ``build_index`` + ``dumps`` (the
write is timed separately), after one warm-up pass so the page cache is hot (as
on a daemon): cold = every file parsed; cached = the content-addressed analysis
cache of a previous run loaded from disk; with 1 worker and with ``--workers``.
The machine may be shared: the 1-minute load average is sampled after each timed
run (``loadavg_1min_min``/``_max``); compare figures taken under similar load.
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
sys.path.insert(0, str(ROOT))  # the test helpers (tests/helpers) that build the packages
from machine import calibration_s, cpu_model  # noqa: E402  (benchmarks/ is sys.path[0])

from kz_runner.contract.indexing.build import build_index, dumps, update_index, write_index  # noqa: E402
from kz_runner.contract.indexing.cache import ContentsCache  # noqa: E402
from tests.helpers.contract_fixtures import mark_repo, write_package  # noqa: E402


def generate(repo: Path, count: int) -> list[str]:
    """Write ``count`` packages under ``repo`` and return their kernel_ids.

    No two packages share a contract file: besides the kernel_id (benchmark.py,
    bench_result.yaml) and the scores, each build_test_env.py has its own seed and
    each desc.yaml its own summary, so no memo keyed by content could shorten a run.
    """
    mark_repo(repo)
    ids = []
    for i in range(count):
        kernel_id = f"cpu/Op{i % 20}/Sub{i % 7}/fp32/impl{i}"
        kp = write_package(repo, kernel_id, best=0.5 + i * 1e-4) / ".kernel_package"
        build_env = kp / "build_test_env.py"
        text = build_env.read_text()
        assert "SEED = 0xBEEF\n" in text
        build_env.write_text(text.replace("SEED = 0xBEEF\n", f"SEED = {0xBEEF + 7919 * i:#x}  # package {i}\n", 1))
        desc = kp / "desc.yaml"
        text = desc.read_text()
        assert "\nsummary: " in text
        desc.write_text(text.replace("\nsummary: ", f"\nsummary: (variant {i}) ", 1))
        ids.append(kernel_id)
    return ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", help="generate into this directory (reused when it already holds a repo)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    load_at_start = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(args.keep) if args.keep else Path(tmp) / "repo"
        t0 = time.perf_counter()
        if not (repo / ".kernel_zoo_root").exists():
            generate(repo, args.packages)
        gen_s = time.perf_counter() - t0
        build_index(repo, workers=args.workers)  # warm-up: page cache, schema compilation

        def timed(make_cache, workers):
            """Wall seconds for load cache + build + dumps, the parent's CPU seconds, and the text."""
            t0, c0 = time.perf_counter(), time.process_time()
            cache = make_cache()
            text = dumps(build_index(repo, cache=cache, workers=workers))
            return time.perf_counter() - t0, time.process_time() - c0, text

        cache_file = Path(tmp) / "cache.json"
        filled = ContentsCache()
        build_index(repo, cache=filled, workers=args.workers)
        filled.save(cache_file)
        figures = {}
        loads = []
        texts = set()
        for label, make_cache in (("cold", lambda: None), ("cached", lambda: ContentsCache.load(cache_file))):
            for workers in (1, args.workers):
                runs, cpus = [], []
                for _ in range(args.repeat):
                    seconds, cpu, text = timed(make_cache, workers)
                    loads.append(os.getloadavg()[0])
                    runs.append(seconds)
                    cpus.append(cpu)
                    texts.add(text)
                figures[f"{label}_workers{workers}_best_s"] = round(min(runs), 3)
                figures[f"{label}_workers{workers}_median_s"] = round(statistics.median(runs), 3)
                if workers == 1:
                    figures[f"{label}_workers1_cpu_best_s"] = round(min(cpus), 3)
        assert len(texts) == 1, "cache or workers changed the index"
        text = texts.pop()
        doc = build_index(repo, cache=ContentsCache.load(cache_file))
        t0 = time.perf_counter()
        write_index(doc, Path(tmp) / "index.json")
        write_s = time.perf_counter() - t0
        one = doc["kernels"][len(doc["kernels"]) // 2]["kernel_id"]
        t0 = time.perf_counter()
        update_index(doc, repo, [one])
        update_s = time.perf_counter() - t0
        print(json.dumps({
            "benchmark": "index_full_rebuild", "packages": doc["counts"]["kernels"],
            "valid": doc["counts"]["valid"], **figures, "repeat": args.repeat,
            "write_s": round(write_s, 3), "update_one_s": round(update_s, 4),
            "index_bytes": len(text.encode()), "generate_s": round(gen_s, 1),
            "cpus": os.cpu_count(), "loadavg_at_start": load_at_start,
            "calibration_loop_s_at_end": calibration_s(),
            "loadavg_1min_min": round(min(loads), 2), "loadavg_1min_max": round(max(loads), 2),
            "python": platform.python_version(), "machine": platform.machine(), "cpu_model": cpu_model(),
        }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``kz index``: scan a kernel repo and write index.json (the leaderboard index)."""
from __future__ import annotations

import argparse
import os
import sys

NAME = "index"
HELP = ("Rebuild index.json from a kernel repo now (honours KERNEL_ZOO_KERNEL_REPO_PATH and "
        "KERNEL_ZOO_INDEX_PATH).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--repo``, ``--out``, ``--json``, ``--head``, ``--cache``/``--no-cache``, ``--workers``."""
    parser.add_argument("--repo", help="kernel repo root (default: $KERNEL_ZOO_KERNEL_REPO_PATH, else .)")
    parser.add_argument("--out", help="index file to write (default: $KERNEL_ZOO_INDEX_PATH, else ./index.json)")
    parser.add_argument("--json", action="store_true", help="also print the index document on stdout")
    parser.add_argument("--head", help="record this commit SHA as the index's head")
    parser.add_argument("--cache", help="analysis cache file (default: under $XDG_CACHE_HOME/kernel_zoo)")
    parser.add_argument("--no-cache", action="store_true", help="parse every package afresh, write no cache")
    parser.add_argument("--workers", type=int, help="processes for a large repo (default: CPU count, at most 8)")


def run(args: argparse.Namespace) -> int:
    """Write the index atomically and print a summary; 0 written, 2 usage error."""
    from kz_runner.contract.host import usable_cpus
    from kz_runner.contract.indexing.build import build_index, default_paths, dumps, write_index
    from kz_runner.contract.indexing.cache import ContentsCache, default_cache_path

    env_repo, env_index = default_paths()
    repo = args.repo or str(env_repo)
    out = args.out or str(env_index)
    if not os.path.isdir(repo):
        print(f"kz index: {repo}: the kernel repo is not a directory", file=sys.stderr)
        return 2
    cache = None
    cache_path = None
    if not args.no_cache:
        cache_path = args.cache or str(default_cache_path(repo))
        cache = ContentsCache.load(cache_path)
    # forked workers: 10,000 packages on 2 cores, warm cache 1.4 s vs 3.1 s with one process,
    # cold 7.0 s vs 15.5 s (benchmarks/bench_index.py)
    workers = args.workers if args.workers is not None else usable_cpus(8)
    doc = build_index(repo, head=args.head, cache=cache, workers=max(1, workers))
    try:
        written = write_index(doc, out)
    except OSError as exc:
        print(f"kz index: cannot write {out}: {exc.strerror}", file=sys.stderr)
        return 2
    if cache is not None and cache_path is not None:
        try:
            cache.save(cache_path)
        except OSError as exc:  # a read-only home: the index is written, the cache is only a speed-up
            print(f"kz index: cache not saved ({cache_path}: {exc.strerror})", file=sys.stderr)
    if args.json:
        sys.stdout.write(dumps(doc))
    else:
        counts = doc["counts"]
        print(f"wrote {written}: {counts['kernels']} kernel(s), {counts['valid']} valid, "
              f"{counts['invalid']} invalid, {counts['with_warnings']} with warnings")
        for kernel in doc["kernels"]:
            if not kernel["valid"]:
                codes = sorted({p["code"] for p in kernel["problems"] if p["severity"] == "error"})
                print(f"  invalid {kernel['kernel_id']}: {', '.join(codes)}")
    return 0

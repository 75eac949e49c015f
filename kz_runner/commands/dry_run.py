"""``kz dry-run PATH``: build twice, compare, benchmark and apply the server's checks, locally."""
from __future__ import annotations

import argparse
import json
import sys

NAME = "dry-run"
HELP = ("run a package (directory or .tar.gz) as a runner would: build twice and compare, benchmark, "
        "check the output with the server's hard checks")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``kz dry-run``."""
    parser.add_argument("path", metavar="PATH", help="package directory or submission .tar.gz")
    parser.add_argument("--json", action="store_true", help="print one JSON document (for agents)")
    parser.add_argument("--keep", action="store_true", help="keep the work directories and print their path")
    parser.add_argument("--build-timeout", type=float, default=600.0, metavar="S",
                        help="seconds each build_test_env.py run may take (default 600)")
    parser.add_argument("--bench-timeout", type=float, default=1200.0, metavar="S",
                        help="seconds benchmark.py may take (default 1200)")


def run(args: argparse.Namespace) -> int:
    """0 when every step passes, 1 when one fails (named), 2 for a usage error."""
    from pathlib import Path

    path = Path(args.path)
    if not path.exists():
        print(f"kz dry-run: {path} does not exist", file=sys.stderr)
        return 2
    if path.is_file() and not path.name.endswith(".tar.gz"):
        print(f"kz dry-run: {path} is neither a package directory nor a .tar.gz", file=sys.stderr)
        return 2
    if args.build_timeout <= 0 or args.bench_timeout <= 0:
        print("kz dry-run: timeouts must be positive", file=sys.stderr)
        return 2
    from kz_runner.contract.dryrun import dry_run, render_text

    result = dry_run(path, build_timeout_s=args.build_timeout, bench_timeout_s=args.bench_timeout, keep=args.keep)
    if args.json:
        print(json.dumps(result.to_json(), indent=2, allow_nan=False))
    else:
        print(render_text(result))
    return 0 if result.ok else 1

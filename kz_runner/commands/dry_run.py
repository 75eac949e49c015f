"""``kz dry-run PATH``: build twice, compare, benchmark and apply the server's checks, locally.

``--server URL`` judges the run against that server's current scorecard for the kernel
(``GET /api/kernels/{kernel_id}``) instead of the package's own ``bench_result.yaml``, so
the local verdict is the one the server would reach; a kernel the server does not
know (404) is judged against the seed, as the server would judge a new kernel.
"""
from __future__ import annotations

import argparse
import json
import sys

from kz_events import defaults

NAME = "dry-run"
HELP = ("run a package (directory or .tar.gz) as a runner would: build twice and compare, benchmark, "
        "check the output with the server's hard checks")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``kz dry-run``."""
    parser.add_argument("path", metavar="PATH", help="package directory or submission .tar.gz")
    parser.add_argument("--json", action="store_true", help="print one JSON document (for agents)")
    parser.add_argument("--keep", action="store_true", help="keep the work directories and print their path")
    parser.add_argument("--build-timeout", type=float, default=defaults.BUILD_TIMEOUT_S, metavar="S",
                        help=f"seconds each build_test_env.py run may take (default {defaults.BUILD_TIMEOUT_S:g})")
    parser.add_argument("--bench-timeout", type=float, default=defaults.BENCHMARK_TIMEOUT_S, metavar="S",
                        help=f"seconds benchmark.py may take (default {defaults.BENCHMARK_TIMEOUT_S:g}, as on a runner)")
    parser.add_argument("--server", default=None, metavar="URL",
                        help="judge against this server's current scorecard for the kernel (a kernel it "
                             "does not know: against the seed) instead of the package's bench_result.yaml")
    parser.add_argument("--kernel-id", default=None, metavar="ID",
                        help="the kernel_id (default: derived from the path, bench_result.yaml or the "
                             "tarball's top folder)")


def server_scorecard(server: str):
    """``scorecard_for`` of :func:`dry_run`: the server's current scorecard, the seed for a kernel it lacks."""
    from kz_runner.tools.dryrun import DryRunScorecard, scorecard_from_kernel_doc
    from kz_runner.worker.client import RetryPolicy, ZooClient

    client = ZooClient(server, retry=RetryPolicy(attempts=2))

    def scorecard_for(kernel_id: str) -> DryRunScorecard:
        doc = client.kernel(kernel_id)
        if doc is None:
            return DryRunScorecard(f"the seed scorecard: {server} has no kernel {kernel_id} (404), so a "
                             "submission would be judged as a new kernel")
        card, missing = scorecard_from_kernel_doc(doc, kernel_id)
        source = f"{server}'s current scorecard for {kernel_id}"
        return DryRunScorecard(source + (f"; {missing}" if missing else ""), card)

    return scorecard_for


def run(args: argparse.Namespace) -> int:
    """0 when every step passes, 1 when one fails (named), 2 for a usage error or an unreachable --server."""
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
    from kz_runner.tools.dryrun import dry_run, render_text
    from kz_runner.worker.client import ClientError

    try:
        scorecard_for = server_scorecard(args.server) if args.server else None
        result = dry_run(path, build_timeout_s=args.build_timeout, bench_timeout_s=args.bench_timeout,
                         keep=args.keep, kernel_id=args.kernel_id, scorecard_for=scorecard_for)
    except (ValueError, ClientError) as exc:  # a bad URL, or the server could not be read
        print(f"kz dry-run: cannot read the scorecard from {args.server}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_json(), indent=2, allow_nan=False))
    else:
        print(render_text(result))
    return 0 if result.ok else 1

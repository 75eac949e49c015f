"""``kz gc``: prune what finished submissions left in pending/ and runs/ (``retention:`` in kz.yaml).

Prints each removal and a total in words; ``--json`` prints one document instead.
"""
from __future__ import annotations

import argparse
import sys

from kz_events import defaults

NAME = "gc"
HELP = "remove old files of finished submissions (retention: in kz.yaml); safe beside a running daemon"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``kz gc``."""
    parser.add_argument("--state-dir", default=defaults.STATE_DIR, metavar="DIR",
                        help=f"state directory (default {defaults.STATE_DIR}): its kz.yaml, event log, pending/ and runs/")
    parser.add_argument("--dry-run", action="store_true", help="print what would be removed; remove nothing")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON document: dry_run, removed [{path, what, bytes}], count, submissions, bytes")


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def run(args: argparse.Namespace) -> int:
    """0 after the sweep (also when nothing was due), 2 without a state directory or with a bad kz.yaml."""
    import time
    from pathlib import Path

    from kz_daemon.config.settings import Config
    from kz_daemon.core.errors import ZooError
    from kz_daemon.upkeep import prune_rejected as retention, prune_runs as gc
    from kz_events.log.reading import open_view

    state_dir = Path(args.state_dir)
    try:
        config = Config.load(state_dir)
    except ZooError as exc:
        print(f"kz gc: {exc.message}", file=sys.stderr)
        return 2
    if not config.paths.events.is_dir():
        print(f"kz gc: no event log at {config.paths.events} (use --state-dir)", file=sys.stderr)
        return 2
    # read-only, without the writer's lock (the log's tail and the history projection): a
    # status read as terminal stays terminal, so what this sees as finished is finished for
    # the running daemon too
    now = time.time()
    with open_view(config.paths.events) as view:
        result = gc.sweep_pages(config, view.finished(gc.cutoff_ts(config, now)), now, dry_run=args.dry_run)
        result.removed.extend(retention.sweep(config, view.knows, now, args.dry_run))
    verb = "would remove" if args.dry_run else "removed"
    if getattr(args, "json", False):
        import json

        print(json.dumps({"dry_run": bool(args.dry_run), "count": result.count, "submissions": result.submissions,
                          "bytes": result.bytes, "removed": [{"path": str(r.path), "what": r.what, "bytes": r.bytes}
                                                             for r in result.removed]}, indent=2))
        return 0
    for r in result.removed:
        print(f"{verb} {r.path} ({r.what}, {_human(r.bytes)})")
    print(f"kz gc: {verb} {result.count} file(s)/folder(s) of {result.submissions} submission(s), "
          f"{_human(result.bytes)} ({result.bytes} bytes)")
    return 0
